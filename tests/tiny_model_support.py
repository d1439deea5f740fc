"""Asking a tiny random-weight model (tests/model_factory.py) on the real engine, as its tests do."""

from __future__ import annotations

from chatapp.engine.engine import Engine
from chatapp.engine.events import GenerationResult
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import Role, StopReason

GREEDY_16 = SamplingParams(temperature=0, max_tokens=16)


def prompt_for(engine: Engine, question: str) -> tuple[int, ...]:
    return tuple(engine.prompt_builder.build([ChatMessage.of(Role.USER, question)]))


def greedy(engine: Engine, prompt: tuple[int, ...]) -> GenerationResult:
    return engine.generate(GenerationRequest(prompt, GREEDY_16, use_cache=False)).wait()


def check_greedy_answers_are_deterministic(engine: Engine, *, more_distinct_tokens_than: int) -> None:
    """One question asked twice: the same 16 tokens (and text) both times, of more than that many distinct ones."""
    prompt = prompt_for(engine, "What is the capital of France?")
    first = greedy(engine, prompt)
    second = greedy(engine, prompt)
    assert first.stop_reason == StopReason.LENGTH
    assert len(first.token_ids) == 16
    assert first.token_ids == second.token_ids
    assert first.text == second.text
    assert len(set(first.token_ids)) > more_distinct_tokens_than
