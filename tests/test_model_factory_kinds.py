"""The tiny sliding-window, hybrid and recurrent models: written reproducibly, run by the real engine.

Each kind has its own memory in llama.cpp (an iSWA KV cache for gemma3, a KV cache plus
recurrent state for LFM2, recurrent state only for Mamba), which is what tests of caching
need them for. The engine runs without a cache here; the low-level checks of the memory go
through its context pointer only after `flush_cache()`, when the engine thread is idle.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import pytest

from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.requests import GenerationRequest
from chatapp.vocabulary import StopReason
from tests.model_factory import (
    TINY_MODEL_THREADS,
    tokenizer_fields,
    write_tiny_gemma3,
    write_tiny_lfm2,
    write_tiny_mamba,
)
from tests.tiny_model_support import GREEDY_16, check_greedy_answers_are_deterministic, greedy, prompt_for

SLIDING_WINDOW = 16
MEMORY_SEQUENCE = 1
CUT_AT = 20
STORY = "Please write a long and detailed story about the sea and the sky."
# The name is the only difference between these prompts, more than SLIDING_WINDOW tokens before the end.
NAMES = ("Alice", "Bob", "Carol", "David")


@dataclass(frozen=True)
class Kind:
    """A model kind and the memory llama.cpp should give it."""

    write: Callable[..., Path]  # (path, *, seed=0)
    n_swa: int
    recurrent: bool
    hybrid: bool
    has_kv_cache: bool  # its sequence state grows with the prompt
    cuts_inside_prompt: bool  # llama_memory_seq_rm can drop a sequence's tail


KINDS = {
    "gemma3": Kind(
        functools.partial(write_tiny_gemma3, sliding_window=SLIDING_WINDOW),
        n_swa=SLIDING_WINDOW,
        recurrent=False,
        hybrid=False,
        has_kv_cache=True,
        cuts_inside_prompt=True,
    ),
    "lfm2": Kind(write_tiny_lfm2, n_swa=0, recurrent=False, hybrid=True, has_kv_cache=True, cuts_inside_prompt=False),
    "mamba": Kind(
        write_tiny_mamba, n_swa=0, recurrent=True, hybrid=False, has_kv_cache=False, cuts_inside_prompt=False
    ),
}


@pytest.fixture(scope="module", params=sorted(KINDS))
def kind_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def model_path(kind_name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return KINDS[kind_name].write(tmp_path_factory.mktemp(f"tiny-{kind_name}") / f"{kind_name}.gguf")


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Iterator[Engine]:
    with open_engine(model_path) as engine:
        yield engine


def open_engine(path: Path) -> Engine:
    return Engine(EngineConfig(model_path=path, context_cap=512, sequences=2, threads=TINY_MODEL_THREADS))


def prefill(engine: Engine, prompt: tuple[int, ...]) -> None:
    """Compute `prompt` into MEMORY_SEQUENCE, then wait until the engine thread is idle."""
    request = GenerationRequest(prompt, GREEDY_16, sequence=MEMORY_SEQUENCE, use_cache=False, prefill_only=True)
    assert engine.generate(request).wait().stop_reason == StopReason.PREFILLED
    engine.flush_cache()
    memory = llama_cpp.llama_get_memory(engine.context.pointer)
    assert llama_cpp.llama_memory_seq_pos_max(memory, MEMORY_SEQUENCE) == len(prompt) - 1


def test_same_arguments_write_the_same_bytes(kind_name: str, model_path: Path, tmp_path: Path) -> None:
    write = KINDS[kind_name].write
    again = write(tmp_path / "again.gguf")
    other_seed = write(tmp_path / "other-seed.gguf", seed=1)
    assert again.read_bytes() == model_path.read_bytes()
    assert other_seed.read_bytes() != model_path.read_bytes()
    assert other_seed.stat().st_size == model_path.stat().st_size < 20_000_000
    assert tokenizer_fields(model_path) == tokenizer_fields(again)


def test_loads_with_the_real_tokenizer_and_chat_template(kind_name: str, engine: Engine) -> None:
    assert engine.info.name.startswith(f"tiny-random-{kind_name}-")
    template = engine.model.chat_template()
    assert template is not None
    assert "<|im_start|>" in template
    prompt = prompt_for(engine, "What is the capital of France?")
    assert engine.model.detokenize(list(prompt), special=True).endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_greedy_generation_is_deterministic_and_not_degenerate(engine: Engine) -> None:
    check_greedy_answers_are_deterministic(engine, more_distinct_tokens_than=8)


def test_the_answer_depends_on_the_prompt(engine: Engine) -> None:
    france = greedy(engine, prompt_for(engine, "What is the capital of France?"))
    spain = greedy(engine, prompt_for(engine, "What is the capital of Spain?"))
    assert france.token_ids != spain.token_ids


def test_the_answer_depends_on_a_token_beyond_the_sliding_window(engine: Engine) -> None:
    """gemma3's sliding-window layers cannot see it (its full-attention layers carry it), nor LFM2's convolutions."""
    prompts = [prompt_for(engine, f"{name} asked me this. {STORY}") for name in NAMES]
    first_difference = next(index for index, tokens in enumerate(zip(*prompts, strict=False)) if len(set(tokens)) > 1)
    assert len(prompts[0]) - first_difference > SLIDING_WINDOW
    answers = {greedy(engine, prompt).token_ids for prompt in prompts}
    assert len(answers) > 1


def test_the_sliding_window_is_in_effect(tmp_path: Path) -> None:
    """The same weights with a window wider than the prompt answer otherwise."""
    answers = []
    for window in (SLIDING_WINDOW, 4096):
        with open_engine(write_tiny_gemma3(tmp_path / f"window-{window}.gguf", sliding_window=window)) as engine:
            prompt = prompt_for(engine, STORY)
            assert len(prompt) > 2 * SLIDING_WINDOW
            answers.append(greedy(engine, prompt).token_ids)
    assert answers[0] != answers[1]


def test_llama_cpp_gives_the_model_its_kind_of_memory(kind_name: str, engine: Engine) -> None:
    kind = KINDS[kind_name]
    model = engine.model.pointer
    assert llama_cpp.llama_model_n_swa(model) == kind.n_swa
    assert llama_cpp.llama_model_is_recurrent(model) == kind.recurrent
    assert llama_cpp.llama_model_is_hybrid(model) == kind.hybrid

    full_sizes, partial_sizes = [], []
    for question in ("Hi", STORY):  # both prompts longer than the sliding window
        prefill(engine, prompt_for(engine, question))
        context = engine.context.pointer
        full_sizes.append(llama_cpp.llama_state_seq_get_size(context, MEMORY_SEQUENCE))
        partial_sizes.append(
            llama_cpp.llama_state_seq_get_size_ext(
                context, MEMORY_SEQUENCE, llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
            )
        )
    # The sliding-window or recurrent part of the state has a fixed size; a KV cache grows.
    assert partial_sizes[0] == partial_sizes[1]
    assert (full_sizes[1] > full_sizes[0]) == kind.has_kv_cache
    assert (partial_sizes[1] < full_sizes[1]) == kind.has_kv_cache

    memory = llama_cpp.llama_get_memory(engine.context.pointer)
    try:
        assert llama_cpp.llama_memory_seq_rm(memory, MEMORY_SEQUENCE, CUT_AT, -1) == kind.cuts_inside_prompt
    finally:
        assert llama_cpp.llama_memory_seq_rm(memory, MEMORY_SEQUENCE, 0, -1)
