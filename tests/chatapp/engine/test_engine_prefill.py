"""Prefill-only requests (warming a prompt before it is sent) on the real bundled model."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.engine.engine import Engine
from chatapp.engine.events import GenerationResult, PromptProgress, PromptReuse
from chatapp.engine.gate import Step
from chatapp.engine.handle import GenerationHandle
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import Role, StopReason
from tests.cache_support import cached_engine

ANSWER_TOKENS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=ANSWER_TOKENS)
PERSONA = "You are a patient tutor. You explain one idea at a time, with a short example. " * 3


def prompt(engine: Engine, question: str, persona: str = PERSONA) -> tuple[int, ...]:
    return tuple(
        engine.prompt_builder.build([ChatMessage.of(Role.SYSTEM, persona), ChatMessage.of(Role.USER, question)])
    )


def draft(engine: Engine, typed: str, persona: str = PERSONA) -> tuple[int, ...]:
    """A question being typed: its prompt up to its text, without the closing and the header."""
    return tuple(
        engine.prompt_builder.draft_tokens([ChatMessage.of(Role.SYSTEM, persona)], ChatMessage.of(Role.USER, typed))
    )


def answer(
    engine: Engine, tokens: tuple[int, ...], *, sequence: int | None = None, use_cache: bool = True
) -> GenerationResult:
    return engine.generate(GenerationRequest(tokens, GREEDY, sequence=sequence, use_cache=use_cache)).wait()


def prefill(
    engine: Engine, tokens: tuple[int, ...], *, sequence: int | None = None, use_cache: bool = True, store: bool = True
) -> GenerationHandle:
    request = GenerationRequest(tokens, GREEDY, sequence=sequence, use_cache=use_cache, prefill_only=True, store=store)
    return engine.generate(request)


@pytest.fixture
def cached(tmp_path: Path, model_path: Path):
    with cached_engine(tmp_path / "kv", model_path) as engine:
        yield engine


def test_the_real_request_reuses_every_warmed_token_and_answers_as_cold(cached: Engine, engine: Engine) -> None:
    target = prompt(cached, "What is a noun? Give two examples from a cookery book.")
    warmed = draft(cached, "What is a noun? Give two examples from a cookery ")[:-1]
    assert target[: len(warmed)] == warmed
    assert len(target) - len(warmed) > 4
    cold = answer(engine, target, use_cache=False)
    handle = prefill(cached, warmed)
    events = list(handle.events())
    result = handle.wait()
    assert result.stop_reason == StopReason.PREFILLED
    assert result.text == ""
    assert result.token_ids == ()
    assert result.stats.computed_tokens == len(warmed)
    assert result.stats.generated_tokens == 0
    assert isinstance(events[0], PromptReuse)
    assert events[0].reused_tokens == result.stats.reused_tokens
    assert len(events) > 1
    assert all(isinstance(event, PromptProgress) for event in events[1:])
    assert events[-1] == PromptProgress(done=len(warmed), total=len(warmed))
    warm = answer(cached, target)
    assert warm.stats.reuse_tier == "device"
    assert warm.stats.reused_tokens == len(warmed)
    assert warm.token_ids == cold.token_ids
    cached.flush_cache()
    assert cached.cache is not None
    assert cached.cache.stats()["requests"] == 1


def test_warming_what_is_resident_computes_nothing_and_cuts_nothing(cached: Engine) -> None:
    target = prompt(cached, "What is a verb?")
    first = answer(cached, target)
    cached.flush_cache()  # the engine thread is done with the answer (its KV recomputed in batches)
    held = max(len(live.tokens) for live in cached.sequences)
    assert held > len(target)  # the prompt and most of the answer
    again = prefill(cached, target).wait()  # every token may be reused: no logits are needed
    assert again.stop_reason == StopReason.PREFILLED
    assert again.stats.reused_tokens == len(target)
    assert again.stats.computed_tokens == 0
    shorter = prefill(cached, target[:20]).wait()
    assert shorter.stats.reused_tokens == 20
    # The answer after the prompt is still resident: the warm-ups did not cut the sequence.
    follow_up = target + first.token_ids + tuple(cached.tokenize("<|im_end|>\n", parse_special=True))
    assert answer(cached, follow_up).stats.reused_tokens == held


def test_a_cancelled_long_warm_up_keeps_its_finished_batches_exactly(engine: Engine) -> None:
    long_question = "Summarise this: " + "the quick brown fox jumps over the lazy dog. " * 85
    target = prompt(engine, long_question)
    batch = engine.context.shape.n_batch
    assert batch < len(target) < engine.info.n_ctx_per_sequence - ANSWER_TOKENS  # two batches, room to answer
    reference = answer(engine, target, use_cache=False, sequence=1)
    with engine.holding(Step.BATCH, after=1) as gate:
        handle = prefill(engine, target, sequence=0, use_cache=False)
        assert gate.wait_until_holding()
        handle.cancel()
        cancelled = handle.wait()
    assert cancelled.stop_reason == StopReason.CANCELLED
    assert engine.sequences[0].tokens == list(target[:batch])  # the first batch, exactly
    after = answer(engine, target, sequence=0)
    assert after.stats.reused_tokens == batch
    assert after.stats.reuse_tier == "device"
    assert after.token_ids == reference.token_ids


def test_a_warm_up_cancelled_while_queued_touches_no_sequence(engine: Engine) -> None:
    answer(engine, prompt(engine, "What is a preposition?"), sequence=1, use_cache=False)
    engine.flush_cache()  # the engine thread is done with the answer
    held = list(engine.sequences[1].tokens)
    with engine.holding(Step.TOKEN, after=1) as gate:  # the answer runs until the warm-up is cancelled
        busy = engine.generate(
            GenerationRequest(
                prompt(engine, "Write a long story."), SamplingParams(temperature=0, max_tokens=60), sequence=0
            )
        )
        queued = prefill(engine, prompt(engine, "Something else entirely."), sequence=1)
        assert gate.wait_until_holding()
        queued.cancel()
    result = queued.wait()
    busy.wait()
    assert result.stop_reason == StopReason.CANCELLED
    assert result.stats.reused_tokens == 0
    assert engine.sequences[1].tokens == held


def test_drafts_stay_out_of_the_cache_tiers_unless_asked(cached: Engine) -> None:
    assert cached.cache is not None
    typed = draft(cached, "How do I say 'thank you' in Japanese, and ")[:-1]
    prefill(cached, typed, store=False).wait()
    cached.flush_cache()
    assert len(cached.cache.index) == 0
    # Still resident: the real request reuses it from the device tier.
    sent = prompt(cached, "How do I say 'thank you' in Japanese, and in Korean?")
    assert sent[: len(typed)] == typed
    assert answer(cached, sent).stats.reused_tokens == len(typed)
    cached.flush_cache()
    after_answer = len(cached.cache.index)
    assert after_answer > 0
    persona_only = draft(cached, "", persona="You are a translator. " * 5)
    prefill(cached, persona_only, store=True).wait()
    cached.flush_cache()
    assert len(cached.cache.index) > after_answer
    assert cached.cache.stats()["requests"] == 1


def test_warming_one_token_at_a_time_still_answers_as_cold(cached: Engine, engine: Engine) -> None:
    """Typing adds a token per word; a one-token batch alone would not give a cold run's KV."""
    longer = SamplingParams(
        temperature=0.0, max_tokens=24
    )  # (with such batches, this answer parts from cold at its 15th token)
    target = prompt(
        cached, "Which is heavier, a kilogram of feathers or a kilogram of iron, and why do people get it wrong?"
    )
    cold = engine.generate(GenerationRequest(target, longer, use_cache=False)).wait()
    for end in range(len(target) - 24, len(target) - 4):
        result = prefill(cached, target[:end], store=False).wait()
        assert result.stop_reason == StopReason.PREFILLED
    assert cached.sequences[0].tokens == list(target[: len(target) - 5])
    warm = cached.generate(GenerationRequest(target, longer)).wait()
    assert warm.stats.reused_tokens == len(target) - 5
    assert warm.stats.reuse_tier == "device"
    assert warm.token_ids == cold.token_ids


def test_a_warm_up_ending_just_before_a_batch_boundary_answers_as_cold(engine: Engine) -> None:
    target = prompt(
        engine, "Summarise this: " + "The museum opens at nine and closes at five, except on Mondays. " * 45
    )
    batch = engine.context.shape.n_batch
    assert batch + 8 < len(target) < engine.info.n_ctx_per_sequence - ANSWER_TOKENS
    reference = answer(engine, target, use_cache=False, sequence=1)
    assert prefill(engine, target[: batch - 1], sequence=0, use_cache=False).wait().stop_reason == StopReason.PREFILLED
    handle = engine.generate(GenerationRequest(target, GREEDY, sequence=0))
    progress = [event.done for event in handle.events() if isinstance(event, PromptProgress)]
    warm = handle.wait()
    # The rest of the first batch is one token: it is evaluated with the next one, never alone.
    assert progress[0] == batch + 1
    assert warm.stats.reused_tokens == batch - 1
    assert warm.token_ids == reference.token_ids
