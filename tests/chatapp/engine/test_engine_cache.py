"""The engine with its prefix cache, on the real bundled model: every restore equals a cold run, bit for bit
(the next token's logits after the prompt) and token for token."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cache import state_assembly
from cache.request_log import log_files, read_columns
from chatapp.engine.batching import on_grid
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.events import GenerationResult, PromptReuse
from chatapp.engine.gate import Step
from chatapp.engine.kv_placement import FRESH_TOKENS
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import Role
from tests.cache_support import cached_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
PERSONA = "You are a patient tutor. You explain one idea at a time, with a short example. " * 3


def prompt(engine: Engine, question: str, persona: str = PERSONA) -> tuple[int, ...]:
    return tuple(
        engine.prompt_builder.build([ChatMessage.of(Role.SYSTEM, persona), ChatMessage.of(Role.USER, question)])
    )


def kept(engine: Engine, tokens: int) -> int:
    """What a prompt reuses of `tokens` it shares: all of them, or whole grid batches where the model
    computes prompts on a grid (always on a GPU: split_rule.py)."""
    return on_grid(tokens, engine.info.prompt_grid)


def answer(engine: Engine, tokens: tuple[int, ...], *, use_cache: bool = True) -> GenerationResult:
    return engine.generate(GenerationRequest(tokens, GREEDY, use_cache=use_cache)).wait()


@pytest.fixture(params=["whole states", "blocks only"])
def cached(request: pytest.FixtureRequest, tmp_path: Path, model_path: Path):
    """A cached engine that keeps whole states ready to load, or one that always assembles blocks."""
    ready_bytes = EngineConfig.ready_state_bytes if request.param == "whole states" else 0
    with cached_engine(tmp_path / "kv", model_path, ready_state_bytes=ready_bytes) as engine:
        yield engine


def restored_whole(engine: Engine, result: GenerationResult) -> None:
    """The restore took the path this engine was made for: a kept whole state, or assembled blocks."""
    assert result.stats.restore is not None
    assert result.stats.restore.whole_state == (engine.config.ready_state_bytes > 0)


def cold_answer(engine: Engine, tokens: tuple[int, ...]):
    """The reference: the session's engine without a cache, computing the whole prompt."""
    return answer(engine, tokens, use_cache=False)


def assert_as_cold(warm: GenerationResult, cold: GenerationResult) -> None:
    assert warm.stats.logits_digest == cold.stats.logits_digest != ""
    assert warm.token_ids == cold.token_ids


def flush(engine: Engine) -> None:
    assert engine.cache is not None
    engine.flush_cache()


def push_out(engine: Engine) -> None:
    """Store what is resident, then fill both sequences with other conversations."""
    flush(engine)
    for other in ("Tell me about rivers.", "Tell me about mountains."):
        answer(engine, prompt(engine, other, persona="You are a geographer."))


def check_a_restore_from_ram_equals_cold(cached: Engine, engine: Engine, target: tuple[int, ...]) -> None:
    """`target` answered, pushed out of the sequences, asked again: all but its fresh tokens come back from RAM,
    by the path `cached` was made for, and the answer is the cold one."""
    cold = cold_answer(engine, target)
    answer(cached, target)
    push_out(cached)
    warm = answer(cached, target)
    assert warm.stats.reuse_tier == "ram"
    assert warm.stats.reused_tokens == kept(cached, len(target) - FRESH_TOKENS)
    assert_as_cold(warm, cold)
    restored_whole(cached, warm)


def test_resident_conversation_is_answered_in_place(cached: Engine) -> None:
    first = prompt(cached, "What is a noun?")
    answer(cached, first)
    again = answer(cached, first)
    assert again.stats.reuse_tier == "device"
    assert again.stats.reused_tokens == kept(cached, len(first) - FRESH_TOKENS)


def test_restore_from_ram_equals_cold(cached: Engine, engine: Engine) -> None:
    check_a_restore_from_ram_equals_cold(cached, engine, prompt(cached, "What is a verb?"))


def test_the_request_log_counts_a_kept_whole_state_as_reuse_no_tier_budget_decides(cached: Engine) -> None:
    """Sizing advice must not credit the RAM and disk budgets with what a kept whole state served: the log
    says it was held in place, as the live context's part is (assembled blocks: only what stayed in place)."""
    target = prompt(cached, "What is an adverb?")
    answer(cached, target)
    push_out(cached)
    warm = answer(cached, target)
    assert warm.stats.reuse_tier == "ram"
    assert cached.cache is not None
    logged = read_columns(log_files(cached.cache.recorder.log.path.parent))
    assert logged.reused[-1] == warm.stats.reused_tokens
    whole = warm.stats.restore is not None and warm.stats.restore.whole_state
    assert whole == (cached.config.ready_state_bytes > 0)
    assert (logged.in_place[-1] == warm.stats.reused_tokens) == whole


def test_a_whole_state_a_warm_up_loaded_is_logged_as_held_in_place_by_the_answer(cached: Engine) -> None:
    """The warm-up loads the kept whole state; the answer then reuses it in place and is credited with the
    RAM tier, but the log says no tier budget decided it (assembled blocks: the cache's work, not in place)."""
    target = prompt(cached, "What is a pronoun?")
    answer(cached, target)
    push_out(cached)
    warm_up = cached.generate(GenerationRequest(target[:-4], GREEDY, sequence=0, prefill_only=True)).wait()
    asked = cached.generate(GenerationRequest(target, GREEDY, sequence=0)).wait()
    assert asked.stats.reuse_tier == "ram"
    assert cached.cache is not None
    logged = read_columns(log_files(cached.cache.recorder.log.path.parent))
    whole = warm_up.stats.restore is not None and warm_up.stats.restore.whole_state
    assert whole == (cached.config.ready_state_bytes > 0)
    warmed = min(asked.stats.reused_tokens, warm_up.stats.reused_tokens)
    assert logged.in_place[-1] == (warmed if whole else 0)
    assert warmed > 0


def test_restore_after_a_restart_comes_from_disk_and_equals_cold(
    tmp_path: Path, model_path: Path, engine: Engine
) -> None:
    with cached_engine(tmp_path / "kv", model_path) as first:
        target = prompt(first, "What is an adjective?")
        cold = cold_answer(engine, target)
        answer(first, target)
    with cached_engine(tmp_path / "kv", model_path) as second:
        warm = answer(second, target)
        expected = kept(second, len(target) - FRESH_TOKENS)
    assert warm.stats.reuse_tier == "disk"
    assert warm.stats.reused_tokens == expected
    assert_as_cold(warm, cold)


def placed_and_answered(engine: Engine, request: GenerationRequest) -> tuple[PromptReuse, GenerationResult]:
    """The request's PromptReuse event and its result."""
    handle = engine.generate(request)
    placed = [event for event in handle.events() if isinstance(event, PromptReuse)]
    return placed[0], handle.wait()


def test_a_warm_up_restored_from_disk_credits_the_answer_to_disk(tmp_path: Path, model_path: Path) -> None:
    with cached_engine(tmp_path / "kv", model_path) as first:
        target = prompt(first, "What is an interjection?")
        answer(first, target)
    with cached_engine(tmp_path / "kv", model_path) as second:
        assert second.cache is not None
        # The app's warm-up while the user types: the prompt less its last few tokens, nothing sampled.
        warm_up = second.generate(GenerationRequest(target[:-4], GREEDY, sequence=0, prefill_only=True)).wait()
        assert warm_up.stats.reuse_tier == "disk"
        placed, asked = placed_and_answered(second, GenerationRequest(target, GREEDY, sequence=0))
        # Answered in place, but every reused token came from disk since the restart.
        assert placed.tier == asked.stats.reuse_tier == "disk"
        assert asked.stats.reused_tokens == kept(second, len(target) - 4)
        by_tier = second.cache.stats()["reused_by_tier"]
        assert by_tier["disk"] == asked.stats.reused_tokens > 0
        assert by_tier["device"] == 0
        follow_up = (*target, *asked.token_ids, *second.tokenize(" Give one more example."))
        placed, next_turn = placed_and_answered(second, GenerationRequest(follow_up, GREEDY, sequence=0))
        assert placed.tier == next_turn.stats.reuse_tier == "device"  # the credit was used once
        assert second.cache.stats()["reused_by_tier"]["device"] == next_turn.stats.reused_tokens > 0


def test_a_cut_inside_a_block_reuses_every_shared_token(cached: Engine, engine: Engine) -> None:
    base = prompt(cached, "Explain the word 'because' with an example sentence.")
    answer(cached, base)
    push_out(cached)
    variant = prompt(cached, "Explain the word 'although' with an example sentence.")
    shared = next(i for i, (a, b) in enumerate(zip(base, variant, strict=False)) if a != b)
    assert shared % 16 != 0  # diverges inside a block
    cold = cold_answer(engine, variant)
    warm = answer(cached, variant)
    assert warm.stats.reused_tokens == kept(cached, shared)
    assert warm.stats.reuse_tier == "ram"
    assert_as_cold(warm, cold)
    restored_whole(cached, warm)


def test_a_long_prefix_assembled_from_many_blocks_equals_cold(
    cached: Engine, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_assembly, "PARALLEL_COPY_BYTES", 1)  # its blocks split between threads, as large ones are
    long_persona = "You are a careful reviewer of essays. " * 40
    target = prompt(cached, "Review this: cats are great.", persona=long_persona)
    assert len(target) > 300  # about 20 blocks of 16 tokens
    check_a_restore_from_ram_equals_cold(cached, engine, target)


def test_no_cache_requests_neither_look_up_nor_store(cached: Engine) -> None:
    target = prompt(cached, "What is an adverb?")
    first = answer(cached, target, use_cache=False)
    second = answer(cached, target, use_cache=False)
    assert first.stats.reused_tokens == second.stats.reused_tokens == 0
    flush(cached)
    assert cached.cache is not None
    assert len(cached.cache.index) == 0


def test_stats_count_reuse_per_tier(cached: Engine) -> None:
    target = prompt(cached, "What is a pronoun?")
    answer(cached, target)
    answer(cached, target)
    assert cached.cache is not None
    stats = cached.cache.stats()
    assert stats["requests"] == 2
    assert stats["reused_by_tier"]["device"] == kept(cached, len(target) - FRESH_TOKENS)
    assert 0.4 < stats["hit_rate"] < 0.6


def test_flush_waits_for_the_answer_just_given(cached: Engine) -> None:
    assert cached.cache is not None
    for index in range(5):
        target = prompt(cached, f"Question number {index}: what is a clause?")
        answer(cached, target)
        cached.flush_cache()
        assert cached.cache.lookup(np.asarray(target)).tokens == kept(cached, len(target))


def test_a_hit_is_computed_when_computing_is_measured_faster(cached: Engine, engine: Engine) -> None:
    target = prompt(cached, "What is a conjunction?", persona=PERSONA * 5)
    assert len(target) > 300  # large enough a hit to be chosen by speed
    cold = cold_answer(engine, target)
    answer(cached, target)
    push_out(cached)
    costs = cached.restore_costs
    # As on a fast GPU with a small model: computing a token takes less than restoring one.
    for _ in range(40):  # past the smoothing of what this engine measured so far
        costs.note_prefill(1000, 0.001)
        for path in ("ram", "whole state"):
            costs.note_restore(path, 1000, 100.0)
    computed = answer(cached, target)
    # Nothing restored: at most the few template tokens another persona left resident.
    assert computed.stats.reuse_tier in ("none", "device")
    assert computed.stats.reused_tokens < 16 < len(target)
    assert computed.token_ids == cold.token_ids
    assert costs.recomputed == 1


def empty_sequences(engine: Engine) -> None:
    """Store what is resident, then put another conversation in every sequence."""
    flush(engine)
    other = prompt(engine, "Tell me about rivers.", persona="You are a geographer.")
    for sequence in range(engine.info.n_sequences):
        engine.generate(GenerationRequest(other, GREEDY, sequence, use_cache=False)).wait()


def test_a_state_past_the_whole_state_budget_is_kept_once_as_rams_entry(
    tmp_path: Path, model_path: Path, engine: Engine
) -> None:
    """A state larger than the engine's own budget for whole states (a gigabyte prefix of a large model; any
    state with a budget of one byte) is kept as RAM's entry instead of its blocks, which go to disk only. It
    is restored whole, equal to cold; in the next process the disk restore reads through a scratch block,
    and the state it assembled is then RAM's entry."""
    target = prompt(engine, "What is a verb?")
    cold = cold_answer(engine, target)
    with cached_engine(tmp_path / "kv", model_path, ready_state_bytes=1) as cached:
        answer(cached, target)
        empty_sequences(cached)
        assert cached.cache is not None
        blocks = list(cached.cache.lookup(np.asarray(target)).blocks)
        assert blocks
        assert not any(info.key in cached.cache.ram for info in blocks)
        assert cached.cache.disk.holding(blocks) == {info.key for info in blocks}
        warm = answer(cached, target)
        assert warm.stats.restore is not None
        assert warm.stats.restore.whole_state
        assert_as_cold(warm, cold)
    with cached_engine(tmp_path / "kv", model_path, ready_state_bytes=1) as again:
        assert again.cache is not None
        from_disk = answer(again, target)
        assert from_disk.stats.reuse_tier == "disk"
        assert_as_cold(from_disk, cold)
        assert not any(info.key in again.cache.ram for info in blocks)
        empty_sequences(again)
        from_ram = answer(again, target)
        assert from_ram.stats.restore is not None
        assert from_ram.stats.restore.whole_state
        assert_as_cold(from_ram, cold)


def test_the_cache_writer_knows_when_the_model_computes(tmp_path: Path, model_path: Path) -> None:
    """The writer rests between blocks only while answers run (writer_pace.py): the engine tells it."""
    with cached_engine(tmp_path / "kv", model_path) as engine:
        cache = engine.cache
        assert cache is not None
        assert not cache.pace.others_computing()  # idle: a flush writes at full speed
        with engine.holding(Step.TOKEN, after=2) as gate:
            request = GenerationRequest(prompt(engine, "Count to ten."), SamplingParams(temperature=0, max_tokens=6))
            handle = engine.generate(request)
            assert gate.wait_until_holding()
            assert cache.pace.others_computing()  # an answer is under way
            gate.release()
            handle.wait()
        engine.flush_cache()
        assert not cache.pace.others_computing()
