"""The test gate: the engine thread held at a chosen step, so tests act mid-answer without racing it."""

from __future__ import annotations

import pytest

from chatapp.engine.engine import Engine
from chatapp.engine.events import AnswerText, PromptProgress
from chatapp.engine.gate import Step, StepGate
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import Role, StopReason

LONG = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)  # never ends before its length


def prompt(engine: Engine, text: str) -> tuple[int, ...]:
    return tuple(engine.prompt_builder.build([ChatMessage.of(Role.USER, text)]))


def test_a_held_answer_waits_at_its_token_until_released(engine: Engine) -> None:
    with engine.holding(Step.TOKEN, after=2) as gate:
        handle = engine.generate(GenerationRequest(prompt(engine, "Count from one to twenty."), LONG, use_cache=False))
        assert gate.wait_until_holding()
        assert not handle.done, "held: the answer cannot have ended"
        assert gate.passed == 2
        gate.release()
        result = handle.wait()
    assert result.stop_reason == StopReason.LENGTH
    assert result.stats.generated_tokens == LONG.max_tokens, "released, the answer ran to its end"


def test_cancelling_a_held_answer_ends_it_with_what_was_said(engine: Engine) -> None:
    with engine.holding(Step.TOKEN, after=4) as gate:
        handle = engine.generate(GenerationRequest(prompt(engine, "Tell me about the sea."), LONG, use_cache=False))
        assert gate.wait_until_holding()
        handle.cancel()
        events = list(handle.events())
        result = handle.wait()
    said = [event for event in events if isinstance(event, AnswerText)]
    assert result.stop_reason == StopReason.CANCELLED
    assert len(said) == result.stats.generated_tokens == 4


def test_a_batch_gate_holds_a_prefill_after_its_first_batch(engine: Engine) -> None:
    tokens = prompt(engine, "Repeat after me: " + "a lighthouse stands on the rocks. " * 80)
    batch = engine.context.shape.n_batch
    assert len(tokens) > batch
    with engine.holding(Step.BATCH, after=1) as gate:
        handle = engine.generate(GenerationRequest(tokens, LONG, use_cache=False, prefill_only=True))
        assert gate.wait_until_holding()
        handle.cancel()
        progress = [event.done for event in handle.events() if isinstance(event, PromptProgress)]
    assert progress == [batch]
    assert handle.wait().stop_reason == StopReason.CANCELLED


def test_the_gate_holds_once_and_leaving_the_block_disarms_it(engine: Engine) -> None:
    question = prompt(engine, "Name a colour.")
    short = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    with engine.holding(Step.TOKEN, after=1) as gate:
        first = engine.generate(GenerationRequest(question, short, use_cache=False))
        assert gate.wait_until_holding()
        first.cancel()
        first.wait()
        second = engine.generate(GenerationRequest(question, short, use_cache=False)).wait()
    assert second.stats.generated_tokens == 3, "after it held once, the gate lets every step pass"
    third = engine.generate(GenerationRequest(question, short, use_cache=False)).wait()
    assert third.token_ids == second.token_ids


def test_a_gate_counts_from_one() -> None:
    with pytest.raises(ValueError, match="counts from 1"):
        StepGate(Step.TOKEN, after=0)
