"""The tiny random-weight model: written reproducibly, loaded and run by the real engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest

from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.llama_native import NativeModel
from chatapp.model_files import bundled_model_path
from tests.model_factory import TINY_MODEL_THREADS, tokenizer_fields, write_tiny_llama
from tests.tiny_model_support import check_greedy_answers_are_deterministic, greedy, prompt_for

N_CTX_TRAIN = 4096
N_LAYER = 2


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(
        tmp_path_factory.mktemp("tiny-model") / "tiny.gguf", n_layer=N_LAYER, n_ctx_train=N_CTX_TRAIN
    )


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_path: Path) -> Iterator[Engine]:
    config = EngineConfig(model_path=tiny_model_path, context_cap=512, sequences=2, threads=TINY_MODEL_THREADS)
    with Engine(config) as engine:
        yield engine


def test_same_arguments_write_the_same_bytes(tmp_path: Path) -> None:
    first = write_tiny_llama(tmp_path / "a.gguf")
    second = write_tiny_llama(tmp_path / "b.gguf")
    other_seed = write_tiny_llama(tmp_path / "c.gguf", seed=1)
    assert first.read_bytes() == second.read_bytes()
    assert other_seed.read_bytes() != first.read_bytes()
    assert other_seed.stat().st_size == first.stat().st_size < 20_000_000


def test_tokenizer_metadata_is_copied_from_the_bundled_model(tiny_model_path: Path) -> None:
    copied = tokenizer_fields(tiny_model_path)
    original = tokenizer_fields(bundled_model_path())
    assert [field.key for field in copied] == [field.key for field in original]
    assert copied == original
    keys = {field.key for field in copied}
    assert {"tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template"} <= keys


def test_loads_with_the_real_tokenizer_and_chat_template(tiny_engine: Engine) -> None:
    info = tiny_engine.info
    assert info.n_ctx_train == N_CTX_TRAIN
    assert tiny_engine.model.n_layer == N_LAYER
    assert info.n_ctx_per_sequence == 512
    assert info.n_sequences == 2
    assert info.name.startswith("tiny-random-llama")
    bundled = NativeModel(bundled_model_path(), vocab_only=True)
    try:
        text = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        assert tiny_engine.tokenize(text, parse_special=True) == bundled.tokenize(
            text, add_special=False, parse_special=True
        )
        template = tiny_engine.model.chat_template()
        assert template == bundled.chat_template()
        assert template is not None
        assert "<|im_start|>" in template
        assert (tiny_engine.model.bos_id, tiny_engine.model.eos_id) == (bundled.bos_id, bundled.eos_id)
    finally:
        bundled.close()


def test_greedy_generation_is_deterministic_and_not_degenerate(tiny_engine: Engine) -> None:
    check_greedy_answers_are_deterministic(tiny_engine, more_distinct_tokens_than=1)


def test_no_end_token_can_win_a_greedy_step(tiny_model_path: Path, tiny_engine: Engine) -> None:
    """The control tokens' output rows are zero (their logit is exactly 0), so an answer never ends by itself."""
    output = next(tensor for tensor in gguf.GGUFReader(tiny_model_path).tensors if tensor.name == "output.weight")
    rows = np.asarray(output.data).reshape(-1, output.data.shape[-1])
    ends = tiny_engine.model.end_of_generation_ids
    assert ends
    assert not rows[list(ends)].any()
    assert np.count_nonzero(rows.any(axis=1)) > 0.99 * len(rows)  # the words' rows are not


def test_the_answer_depends_on_the_whole_prompt(tiny_engine: Engine) -> None:
    """Not only on its last tokens, which are the same for every chat prompt: a stale KV shows."""
    france = greedy(tiny_engine, prompt_for(tiny_engine, "What is the capital of France?"))
    spain = greedy(tiny_engine, prompt_for(tiny_engine, "What is the capital of Spain?"))
    assert france.token_ids != spain.token_ids
