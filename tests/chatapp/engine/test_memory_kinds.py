"""The cache on every memory kind: plain KV, sliding window, hybrid and recurrent (tiny models).

For each kind the engine restores from RAM, from disk after a restart, rewinds in place,
and continues conversations; every answer equals a cold run of the same prompt, token for
token. Where the state cannot be cut, reuse lands on checkpoints: the tests say where.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import pytest

from cache.keys import as_token_array
from cache.memory_kinds import MemoryKind
from chatapp.engine.batching import FLASH_ATTENTION_ROWS, on_grid
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.events import GenerationResult, PromptProgress
from chatapp.engine.gate import Step
from chatapp.engine.kv_placement import FRESH_TOKENS
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.prompting.planner import PromptPlanner
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import ReuseTier, Role, StopReason
from tests.cache_support import cached_engine
from tests.conftest import ON_DEVICE
from tests.model_factory import (
    TINY_MODEL_THREADS,
    write_tiny_gemma3,
    write_tiny_lfm2,
    write_tiny_llama,
    write_tiny_mamba,
)

pytestmark = pytest.mark.device
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
CONTEXT = 1024
# On a device, prompts are computed (and reused) in whole 64-token batches (split_rule.py): there
# the persona spans several, so a restore has whole batches to restore.
PERSONA = "You are a careful assistant who answers in short sentences and checks every fact twice. " * (
    24 if ON_DEVICE else 3
)
WRITERS: dict[MemoryKind, Callable[[Path], Path]] = {
    MemoryKind.PLAIN: write_tiny_llama,
    MemoryKind.ISWA: write_tiny_gemma3,
    MemoryKind.HYBRID: write_tiny_lfm2,
    MemoryKind.RECURRENT: write_tiny_mamba,
}


class Tiny(NamedTuple):
    """A tiny model of one memory kind, and whether its engines use flash attention."""

    kind: MemoryKind
    path: Path
    flash_attention: bool = False


# On a device (`make test-vulkan`) every case runs with flash attention off and on: its kernels differ there.
FLASH = (False, True) if ON_DEVICE else (False,)
CASES = [(kind, flash) for kind in WRITERS for flash in FLASH]


@pytest.fixture(scope="module", params=CASES, ids=lambda case: f"{case[0]}{'-flash' if case[1] else ''}")
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    kind, flash = request.param
    return Tiny(kind, WRITERS[kind](tmp_path_factory.mktemp(f"model-{kind}") / "tiny.gguf"), flash)


@pytest.fixture(scope="module")
def cold(model: Tiny) -> Iterator[Engine]:
    config = EngineConfig(
        model_path=model.path,
        context_cap=CONTEXT,
        sequences=1,
        threads=TINY_MODEL_THREADS,
        flash_attention=model.flash_attention,
    )
    with Engine(config) as engine:
        yield engine


def open_cached(model: Tiny, folder: Path, sequences: int = 1, n_batch: int = 512, swa_full: bool = True) -> Engine:
    engine = cached_engine(
        folder,
        model[1],
        block_size=16,
        context=CONTEXT,
        sequences=sequences,
        threads=TINY_MODEL_THREADS,
        n_batch=n_batch,
        swa_full=swa_full,
        flash_attention=model.flash_attention,
    )
    assert engine.cache is not None, engine.cache_problem
    assert engine.info.memory_kind is model[0]
    return engine


def messages_for(question: str, history: tuple[str, ...] = ()) -> list[ChatMessage]:
    """The persona, earlier questions with fixed answers, and the new question."""
    messages = [ChatMessage.of(Role.SYSTEM, PERSONA)]
    for earlier in history:
        messages += [ChatMessage.of(Role.USER, earlier), ChatMessage.of(Role.ASSISTANT, f"About {earlier}: noted.")]
    return [*messages, ChatMessage.of(Role.USER, question)]


def request_for(engine: Engine, messages: list[ChatMessage], *, prefill_only: bool = False) -> GenerationRequest:
    """The request the chat service makes: the prompt and the boundaries it names."""
    prompt = tuple(engine.prompt_builder.build(messages))
    checkpoints = PromptPlanner(engine.prompt_builder).boundaries(messages) if engine.takes_checkpoints else ()
    return GenerationRequest(prompt, GREEDY, checkpoints=checkpoints, prefill_only=prefill_only)


def ask(engine: Engine, messages: list[ChatMessage]) -> GenerationResult:
    return engine.generate(request_for(engine, messages)).wait()


def cold_answer(cold: Engine, messages: list[ChatMessage]) -> tuple[int, ...]:
    prompt = tuple(cold.prompt_builder.build(messages))
    return cold.generate(GenerationRequest(prompt, GREEDY, use_cache=False)).wait().token_ids


def reusable(engine: Engine, tokens: int, prompt: int) -> int:
    """The most of its first `tokens` a `prompt`-token prompt reuses: all of them (less the last rows every
    answer computes) where batches end anywhere; whole grid batches where prompts are computed on the
    grid (a device: split_rule.py)."""
    return on_grid(min(tokens, prompt - engine.placer.fresh_tokens), engine.info.prompt_grid)


def persona_end(engine: Engine) -> int:
    """Where a new question on the persona leaves an earlier one (a boundary the requests name)."""
    return PromptPlanner(engine.prompt_builder).boundaries(messages_for("x"))[0]


def test_the_state_format_is_understood(model: Tiny, tmp_path: Path) -> None:
    with open_cached(model, tmp_path) as engine:
        assert engine.layout is not None
        assert engine.layout.kind is model[0]
        assert engine.takes_checkpoints == (model[0] is not MemoryKind.PLAIN)


def test_a_new_question_on_the_persona_restores_it_from_ram(model: Tiny, cold: Engine, tmp_path: Path) -> None:
    with open_cached(model, tmp_path) as engine:
        first = messages_for("Name a colour.")
        assert ask(engine, first).token_ids == cold_answer(cold, first)
        other = [ChatMessage.of(Role.SYSTEM, "You are terse."), ChatMessage.of(Role.USER, "Hello there.")]
        ask(engine, other)  # takes the only sequence: the persona leaves the context
        engine.flush_cache()
        second = messages_for("Name a fruit.")
        result = ask(engine, second)
        assert result.token_ids == cold_answer(cold, second)
        assert result.stats.reuse_tier is ReuseTier.RAM
        shared = reusable(engine, persona_end(engine), result.stats.prompt_tokens)
        if model[0] is MemoryKind.PLAIN:
            assert result.stats.reused_tokens >= shared  # token-exact: the persona and a little more
        else:
            assert result.stats.reused_tokens == shared  # exactly the checkpoint at the persona's end


def test_after_a_restart_the_persona_comes_from_disk(model: Tiny, cold: Engine, tmp_path: Path) -> None:
    with open_cached(model, tmp_path) as engine:
        ask(engine, messages_for("Name a colour."))
    with open_cached(model, tmp_path) as engine:
        second = messages_for("Name a river.")
        result = ask(engine, second)
        assert result.token_ids == cold_answer(cold, second)
        assert result.stats.reuse_tier is ReuseTier.DISK
        assert result.stats.reused_tokens >= reusable(engine, persona_end(engine), result.stats.prompt_tokens)


def test_a_follow_up_continues_in_place_and_equals_a_cold_run(model: Tiny, cold: Engine, tmp_path: Path) -> None:
    with open_cached(model, tmp_path) as engine:
        first = messages_for("Name a colour.")
        answer = ask(engine, first)
        engine.flush_cache()  # the answer's recompute runs while the user reads
        follow_up = [
            *first,
            ChatMessage(Role.ASSISTANT, (answer.text,), answer.token_ids),
            ChatMessage.of(Role.USER, "Why that one?"),
        ]
        result = ask(engine, follow_up)
        assert result.token_ids == cold_answer(cold, follow_up)
        assert result.stats.reuse_tier is ReuseTier.DEVICE
        # Everything before the new question was kept in place (after the answer's recompute).
        kept = len(engine.prompt_builder.build(first)) + len(answer.token_ids) - 1
        assert result.stats.reused_tokens >= reusable(engine, kept, result.stats.prompt_tokens)


def test_asking_again_rewinds_the_sequence_and_equals_a_cold_run(model: Tiny, cold: Engine, tmp_path: Path) -> None:
    with open_cached(model, tmp_path) as engine:
        question = messages_for("Name a colour.", history=("Name a bird.",))
        first = ask(engine, question)
        again = ask(engine, question)  # a regenerate: the prompt's last tokens are evaluated again
        assert again.token_ids == first.token_ids == cold_answer(cold, question)
        assert again.stats.reuse_tier is ReuseTier.DEVICE
        length = len(engine.prompt_builder.build(question))
        assert again.stats.reused_tokens == reusable(engine, length - FRESH_TOKENS, length)
        branch = messages_for("Name a tree.", history=("Name a bird.",))  # another question after the history
        result = ask(engine, branch)
        assert result.token_ids == cold_answer(cold, branch)
        boundary = PromptPlanner(engine.prompt_builder).boundaries(branch)[-1]
        assert result.stats.reused_tokens >= reusable(engine, boundary, result.stats.prompt_tokens)


def test_a_document_long_past_the_window_restores_exactly(model: Tiny, cold: Engine, tmp_path: Path) -> None:
    document = " ".join(f"Line {n}: the beacon at harbour {n} was lit in {1800 + n}." for n in range(30))
    with open_cached(model, tmp_path) as engine:
        first = [ChatMessage.of(Role.SYSTEM, PERSONA), ChatMessage.of(Role.USER, document, "When was beacon 3 lit?")]
        ask(engine, first)
    with open_cached(model, tmp_path) as engine:
        second = [ChatMessage.of(Role.SYSTEM, PERSONA), ChatMessage.of(Role.USER, document, "Which beacon is last?")]
        result = ask(engine, second)
        assert result.token_ids == cold_answer(cold, second)
        document_end = PromptPlanner(engine.prompt_builder).boundaries(second)[-1]
        assert result.stats.reused_tokens >= reusable(engine, document_end, result.stats.prompt_tokens)
        assert document_end > 300


SMALL_BATCH = 32  # several batches on short prompts


def small_batch(model: Tiny) -> int:
    """Batches of SMALL_BATCH tokens, or the fewest flash attention allows (config.py)."""
    return 2 * FLASH_ATTENTION_ROWS if model.flash_attention else SMALL_BATCH


def test_a_prompt_is_batched_alike_with_and_without_the_cache(model: Tiny, tmp_path: Path) -> None:
    """Batches end at checkpoints either way: `--no-cache` answers as a cached run computes."""
    with open_cached(model, tmp_path, n_batch=small_batch(model)) as engine:
        request = request_for(engine, messages_for("Name a colour.", history=("Name a bird.",)))

        def run(request: GenerationRequest) -> tuple[list[int], GenerationResult]:
            handle = engine.generate(request)
            ends = [event.done for event in handle.events() if isinstance(event, PromptProgress)]
            return ends, handle.wait()

        cached_ends, cached = run(request)  # a fresh cache: computed in full, checkpoints stored
        uncached_ends, uncached = run(replace(request, use_cache=False))
        assert cached.stats.reused_tokens == uncached.stats.reused_tokens == 0
        assert cached_ends == uncached_ends
        grid = engine.info.prompt_grid  # on a grid, checkpoints sit on grid points
        assert {on_grid(end, grid) for end in request.checkpoints} - {0} <= set(cached_ends)
        assert cached.token_ids == uncached.token_ids


def test_a_warm_up_one_token_past_a_batch_finishes_and_answers_as_cold(
    model: Tiny, cold: Engine, tmp_path: Path
) -> None:
    """A batch never leaves one token alone: on recurrent state that cut could only rewind, again and again."""
    with open_cached(model, tmp_path, n_batch=small_batch(model)) as engine:
        messages = messages_for("Name a colour.")
        full = request_for(engine, messages)
        batch = small_batch(model)
        assert len(full.prompt_tokens) > 2 * batch + 1
        for length in (batch + 1, 2 * batch + 1):
            warm = GenerationRequest(full.prompt_tokens[:length], GREEDY, prefill_only=True)
            assert engine.generate(warm).wait().stop_reason is StopReason.PREFILLED
            assert engine.sequences[0].tokens == list(warm.prompt_tokens)
        assert ask(engine, messages).token_ids == cold_answer(cold, messages)


def test_a_cancelled_prefill_keeps_its_finished_batches_and_answers_as_cold(
    model: Tiny, cold: Engine, tmp_path: Path
) -> None:
    with open_cached(model, tmp_path, n_batch=small_batch(model)) as engine:
        messages = messages_for("Name a colour.")
        with engine.holding(Step.BATCH, after=2) as gate:
            handle = engine.generate(request_for(engine, messages))
            assert gate.wait_until_holding()
            handle.cancel()
            assert handle.wait().stop_reason is StopReason.CANCELLED
        held = list(engine.sequences[0].tokens)
        prompt = engine.prompt_builder.build(messages)
        assert 0 < len(held) < len(prompt)
        assert held == prompt[: len(held)]
        result = ask(engine, messages)
        assert result.token_ids == cold_answer(cold, messages)
        assert result.stats.reuse_tier is ReuseTier.DEVICE
        assert result.stats.reused_tokens == len(held)


def test_an_answer_stopped_between_tokens_leaves_exact_state(model: Tiny, cold: Engine, tmp_path: Path) -> None:
    """Stopped after its second token: the sequence holds the prompt and the tokens evaluated, nothing half-done."""
    with open_cached(model, tmp_path) as engine:
        messages = messages_for("Name a colour.")
        with engine.holding(Step.TOKEN, after=2) as gate:
            handle = engine.generate(request_for(engine, messages))
            assert gate.wait_until_holding()
            handle.cancel()
            stopped = handle.wait()
        assert stopped.stop_reason is StopReason.CANCELLED
        engine.flush_cache()
        prompt = engine.prompt_builder.build(messages)
        held = engine.sequences[0].tokens
        assert held == [*prompt, *stopped.token_ids][: len(held)]
        assert ask(engine, messages).token_ids == cold_answer(cold, messages)


@pytest.fixture(scope="module")
def iswa(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    return Tiny(MemoryKind.ISWA, write_tiny_gemma3(tmp_path_factory.mktemp("iswa") / "tiny.gguf"))


@pytest.mark.skipif(ON_DEVICE, reason="on a device the window cache is always full-size (loading.py)")
def test_without_a_full_size_window_cuts_are_checked_and_rewound_exactly(iswa: Tiny, tmp_path: Path) -> None:
    """swa_full off: 256 window cells per sequence, reused once the prompt is longer, so a cut
    behind the window rewinds to a checkpoint and a cut inside it must find every cell it needs."""
    cold_config = EngineConfig(
        model_path=iswa[1],
        context_cap=CONTEXT,
        sequences=1,
        threads=TINY_MODEL_THREADS,
        n_batch=SMALL_BATCH,
        swa_full=False,
    )
    history = tuple(f"Name a bird that nests near lake number {n} and say why it does." for n in range(12))
    with (
        Engine(cold_config) as cold,
        open_cached(iswa, tmp_path / "cache", n_batch=SMALL_BATCH, swa_full=False) as engine,
    ):
        first = messages_for("Name a colour.", history=history)
        assert len(engine.prompt_builder.build(first)) > 300  # past the 256 window cells
        assert ask(engine, first).token_ids == cold_answer(cold, first)
        engine.flush_cache()
        assert engine.context.min_position(0) > persona_end(engine)  # the window slid past the persona
        for branch in (messages_for("Name a tree.", history=history[:11]), messages_for("Name a tree.")):
            result = ask(engine, branch)
            assert result.token_ids == cold_answer(cold, branch)
            assert result.stats.reused_tokens > 0
        assert result.stats.reuse_tier is ReuseTier.DEVICE
        assert result.stats.reused_tokens == persona_end(engine)  # rewound to the checkpoint at the persona's end


@pytest.mark.skipif(ON_DEVICE, reason="on a device the window cache is always full-size (loading.py)")
@pytest.mark.parametrize("shared", [250, 200, 280])
def test_a_cut_across_the_window_ring_continues_exactly_as_a_cold_run(iswa: Tiny, tmp_path: Path, shared: int) -> None:
    """swa_full off, batches of 64: the window cache is a ring of 256 cells, position p in cell p mod 256.
    A sequence of 300 tokens wrapped it; a branch cut at 250 or 200 frees cells on both sides of the
    ring's end, and llama.cpp would refill them from cell 0, where a cold run writes position `shared`
    in cell `shared` (the sequence is written again); a cut at 280 frees cells from 24 on, where a cold
    run writes next. The next token's logits after the branch equal a cold run's bit for bit."""
    config = dict(context_cap=CONTEXT, sequences=1, threads=TINY_MODEL_THREADS, n_batch=64, swa_full=False)
    first = tuple(range(100, 400))
    branch = (*first[:shared], *range(1000, 1060))
    with (
        Engine(EngineConfig(model_path=iswa.path, **config)) as cold,  # type: ignore[arg-type]
        open_cached(iswa, tmp_path, n_batch=64, swa_full=False) as engine,
    ):
        assert engine.placer.window_ring == 256
        engine.generate(GenerationRequest(first, GREEDY)).wait()
        engine.flush_cache()
        warm = engine.generate(GenerationRequest(branch, GREEDY)).wait()
        assert warm.stats.reuse_tier is ReuseTier.DEVICE
        assert warm.stats.reused_tokens == shared
        expected = cold.generate(GenerationRequest(branch, GREEDY, use_cache=False)).wait()
        assert warm.stats.logits_digest == expected.stats.logits_digest
        assert warm.token_ids == expected.token_ids


def test_a_window_with_a_gap_is_never_kept_by_a_cut(iswa: Tiny, tmp_path: Path) -> None:
    """A window cache reuses slid-out cells in no fixed order; a cut that would keep a gap rewinds instead."""
    with open_cached(iswa, tmp_path) as engine:
        messages = messages_for("Name a colour.", history=("Name a bird.", "Name a fish."))
        ask(engine, messages)
        engine.flush_cache()  # the engine thread is idle from here on
        cut = PromptPlanner(engine.prompt_builder).boundaries(messages)[-1] - 2  # no checkpoint there
        assert persona_end(engine) < cut - 6
        assert engine.context.remove(0, cut - 6, cut - 4)  # two cells the next token needs
        assert engine.context.min_position(0) == 0  # the oldest cell alone does not show the gap
        kept = engine.placer.cut(0, cut)
        assert kept == on_grid(persona_end(engine), engine.info.prompt_grid)  # rewound to the persona's checkpoint
        assert engine.sequences[0].tokens == engine.prompt_builder.build(messages)[:kept]


def test_a_cut_never_keeps_the_placeholders_of_a_restored_window(iswa: Tiny, tmp_path: Path) -> None:
    """A restored window holds a zero cell for every position before the checkpoint's, where a cold run
    has older cells (assemble_state's window_ring). A branch behind the restore point must not cut the
    sequence in place: its window there would be those zeros."""
    cold_config = EngineConfig(model_path=iswa.path, context_cap=CONTEXT, sequences=1, threads=TINY_MODEL_THREADS)
    history = ("Name a bird.", "Name a fish.", "Name a tree.", "Name a stone.")
    with Engine(cold_config) as cold, open_cached(iswa, tmp_path) as engine:
        ask(engine, messages_for("Name a colour.", history=history))
        ask(engine, messages_for("Name a river."))  # the one sequence moves on
        engine.flush_cache()
        restored = ask(engine, messages_for("Name a colour.", history=history))
        assert restored.stats.reuse_tier is ReuseTier.RAM
        engine.flush_cache()  # the engine thread is idle from here on
        assert engine.context.min_position(0) == 0  # the placeholders are cells to llama.cpp
        assert engine.sequences[0].window_from == restored.stats.reused_tokens - engine.info.window
        branch = messages_for("Name a colour.", history=history[:1])
        shared = len(engine.prompt_builder.build(branch)) - FRESH_TOKENS
        assert shared < restored.stats.reused_tokens - engine.info.window  # behind the restored window
        result = ask(engine, branch)
        assert result.token_ids == cold_answer(cold, branch)
        assert result.stats.reuse_tier is not ReuseTier.DEVICE  # no checkpoint of this session lies behind it


def test_a_rewound_window_keeps_its_placeholders_out_of_later_cuts(iswa: Tiny, tmp_path: Path) -> None:
    """A rewind writes the window as a restore does (placeholders before the checkpoint's cells): a later
    prompt sharing less than that must not cut in place into them either."""
    cold_config = EngineConfig(model_path=iswa.path, context_cap=CONTEXT, sequences=1, threads=TINY_MODEL_THREADS)
    with Engine(cold_config) as cold, open_cached(iswa, tmp_path) as engine:
        messages = messages_for("Name a colour.", history=("Name a bird.", "Name a fish."))
        ask(engine, messages)
        engine.flush_cache()  # the engine thread is idle from here on
        cut = PromptPlanner(engine.prompt_builder).boundaries(messages)[-1] - 2  # no checkpoint there
        assert engine.context.remove(0, cut - 6, cut - 4)  # a gap in the window: the cut must rewind
        kept = engine.placer.cut(0, cut)
        # Rewound to the persona's checkpoint (on a device: its last whole grid batch).
        assert kept == on_grid(persona_end(engine), engine.info.prompt_grid) > engine.info.window
        assert engine.sequences[0].window_from == kept - engine.info.window
        other = [ChatMessage.of(Role.SYSTEM, "You are brief."), ChatMessage.of(Role.USER, "Name a colour.")]
        shared = engine.sequences.match_in(0, as_token_array(engine.prompt_builder.build(other)))
        assert 0 < shared < kept - engine.info.window  # the template's first tokens only
        result = ask(engine, other)
        assert result.token_ids == cold_answer(cold, other)
        assert result.stats.reuse_tier is not ReuseTier.DEVICE
