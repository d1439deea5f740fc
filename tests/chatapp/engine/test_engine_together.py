"""Several requests at once: taken in turns, each on its own sequence, each answered as alone."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.events import PromptProgress
from chatapp.engine.gate import Step, StepGate
from chatapp.engine.handle import EngineEvent, GenerationHandle
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.engine.turns import common_prefix_length
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import Role, StopReason
from tests.cache_support import cached_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)  # never ends before its length
LONG_TEXT = " ".join(
    f"Lighthouse {number} stands on a rock and flashes every {number % 7 + 2} seconds." for number in range(40)
)


@pytest.fixture(scope="module")
def small_batches(model_path: Path) -> Iterator[Engine]:
    """Batches of 8 tokens: a long prompt takes many steps, so another request can run between them."""
    config = EngineConfig(model_path=model_path, context_cap=1024, sequences=3, n_batch=8, threads=1)
    with Engine(config) as engine:
        yield engine


def prompt(engine: Engine, text: str) -> tuple[int, ...]:
    return tuple(engine.prompt_builder.build([ChatMessage.of(Role.USER, text)]))


@contextmanager
def holding_twice(
    engine: Engine, request: GenerationRequest, first: tuple[Step, int], then: tuple[Step, int]
) -> Iterator[tuple[StepGate, StepGate]]:
    """Two holds of the engine, each at a step of `request` only: `engine.holding(*first)`, `engine.holding(*then)`."""

    def is_it(other: GenerationRequest) -> bool:
        return other is request

    with engine.holding(*first, where=is_it) as first_gate, engine.holding(*then, where=is_it) as then_gate:
        yield first_gate, then_gate


@contextmanager
def arriving_during_the_prompt(
    engine: Engine, first: GenerationRequest, second: GenerationRequest
) -> Iterator[tuple[GenerationHandle, GenerationHandle]]:
    """Start `first`; start `second` while `first`'s prompt is read (after its first batch); hold the engine,
    for the block, at `first`'s first answer token. Yields both handles."""
    with holding_twice(engine, first, (Step.BATCH, 1), (Step.TOKEN, 1)) as (first_batch, first_token):
        first_handle = engine.generate(first)
        assert first_batch.wait_until_holding()
        second_handle = engine.generate(second)
        first_batch.release()
        assert first_token.wait_until_holding()
        yield first_handle, second_handle


def test_a_short_request_is_answered_while_a_long_prompt_is_read(small_batches: Engine) -> None:
    engine = small_batches
    long_request = GenerationRequest(prompt(engine, LONG_TEXT + " Which one flashes slowest?"), GREEDY, use_cache=False)
    short_request = GenerationRequest(prompt(engine, "Name a colour."), GREEDY, use_cache=False)
    alone = engine.generate(short_request).wait()
    assert len(long_request.prompt_tokens) > 40 * 8  # many more batches than the short answer has steps
    # The short request arrives while the long prompt is being read.
    with arriving_during_the_prompt(engine, long_request, short_request) as (long_handle, short_handle):
        # The long prompt's answer has not begun, and the short request is already answered.
        assert short_handle.done
        together = short_handle.wait()
    long_result = long_handle.wait()
    assert together.text == alone.text
    assert together.token_ids == alone.token_ids
    assert together.stop_reason is StopReason.LENGTH
    assert long_result.stats.generated_tokens == 4
    assert long_result.stats.prompt_tokens == len(long_request.prompt_tokens)


def test_each_request_gets_its_own_sequence_and_a_cancel_stops_only_its_own(small_batches: Engine) -> None:
    engine = small_batches
    first = GenerationRequest(prompt(engine, LONG_TEXT), GREEDY, use_cache=False)
    second = GenerationRequest(
        prompt(engine, "Name a number."), SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    )
    with engine.holding(Step.TOKEN, 2, where=lambda request: request is second) as held:
        long_handle = engine.generate(first)
        short_handle = engine.generate(second)
        assert held.wait_until_holding()
        long_handle.cancel()
    cancelled = long_handle.wait()
    answered = short_handle.wait()
    assert cancelled.stop_reason is StopReason.CANCELLED
    assert answered.stop_reason is StopReason.LENGTH
    assert answered.stats.generated_tokens == 16
    engine.flush_cache()  # waits for both to end, their after-answer work included


def test_requests_naming_one_sequence_take_turns_on_it(small_batches: Engine) -> None:
    engine = small_batches
    held = GenerationRequest(prompt(engine, "Name a tree."), GREEDY, sequence=1, use_cache=False)
    first = GenerationRequest(prompt(engine, "Name a bird."), GREEDY, sequence=0, use_cache=False)
    second = GenerationRequest(prompt(engine, "Name a fish."), GREEDY, sequence=0, use_cache=False)
    alone = [engine.generate(request).wait() for request in (first, second)]
    with engine.holding(Step.TOKEN, 1, where=lambda request: request is held) as gate:
        holding = engine.generate(held)
        assert gate.wait_until_holding()
        # Both arrive while the engine is held, so both are taken in one round.
        handles = [engine.generate(first), engine.generate(second)]
    results = [handle.wait() for handle in handles]
    holding.wait()
    assert [result.token_ids for result in results] == [result.token_ids for result in alone]


def test_a_request_cancelled_while_it_waits_ends_at_once(small_batches: Engine) -> None:
    engine = small_batches
    running = GenerationRequest(prompt(engine, "Name a tree."), GREEDY, use_cache=False)
    warm_up = GenerationRequest(prompt(engine, "Name a bird."), GREEDY, prefill_only=True, use_cache=False)
    waiting = GenerationRequest(prompt(engine, "Name a fish."), GREEDY, use_cache=False)
    with holding_twice(engine, running, (Step.TOKEN, 1), (Step.TOKEN, 3)) as (first_token, third_token):
        first = engine.generate(running)
        assert first_token.wait_until_holding()
        blocked = engine.generate(warm_up)  # waits while an answer runs, at the head of the queue
        behind = engine.generate(waiting)
        behind.cancel()
        first_token.release()
        assert third_token.wait_until_holding()
        # Two steps later the cancelled request has ended, though the warm-up ahead of it waits.
        assert behind.done
        assert not blocked.done
    assert behind.wait().stop_reason is StopReason.CANCELLED
    assert behind.wait().stats.generated_tokens == 0
    first.wait()
    assert blocked.wait().stop_reason is StopReason.PREFILLED


def test_the_prompt_with_less_left_to_compute_goes_first(small_batches: Engine) -> None:
    engine = small_batches
    first = GenerationRequest(prompt(engine, LONG_TEXT), GREEDY, use_cache=False)
    longer = GenerationRequest(prompt(engine, LONG_TEXT + " Which one flashes slowest?"), GREEDY, use_cache=False)
    alone = engine.generate(longer).wait()
    # The longer prompt has more left to compute than the first has.
    with arriving_during_the_prompt(engine, first, longer) as (first_handle, longer_handle):
        # The first prompt was computed to its end while the longer one took only its first batch.
        longer_progress = [event for event in _events_so_far(longer_handle) if isinstance(event, PromptProgress)]
        assert len(longer_progress) == 1
    assert first_handle.wait().stats.generated_tokens == 4
    assert longer_handle.wait().token_ids == alone.token_ids


def _events_so_far(handle: GenerationHandle) -> list[EngineEvent | None]:
    """The events a handle has queued so far, without waiting for more (they stay readable)."""
    events = []
    while True:
        try:
            event = handle._events.get_nowait()
        except queue.Empty:
            break
        events.append(event)
    for event in events:
        handle._events.put(event)
    return events


def test_requests_that_start_together_with_one_long_prefix_compute_it_once(
    tmp_path: Path, model_path: Path, small_batches: Engine
) -> None:
    persona = ChatMessage.of(Role.SYSTEM, LONG_TEXT)
    questions = ["Which lighthouse flashes slowest?", "Which flashes fastest?", "How many are there?"]
    with cached_engine(tmp_path / "kv", model_path, sequences=4, n_batch=8, threads=1) as engine:
        requests = [
            GenerationRequest(
                tuple(engine.prompt_builder.build([persona, ChatMessage.of(Role.USER, question)])), GREEDY
            )
            for question in questions
        ]
        shared = common_prefix_length(np.asarray(requests[0].prompt_tokens), np.asarray(requests[1].prompt_tokens))
        assert shared > 300
        with engine.holding(Step.BATCH, 1) as gate:
            handles = [engine.generate(request) for request in requests]  # all queued while the engine is held
            assert gate.wait_until_holding()
        results = [handle.wait() for handle in handles]
    computed = [result.stats.computed_tokens for result in results]
    # One computes the shared beginning; the others restore it and compute only their question.
    assert sum(count > shared for count in computed) == 1
    assert all(result.stats.reused_tokens >= shared - 16 for result in results if result.stats.computed_tokens < shared)
    cold = [small_batches.generate(replace(request, use_cache=False)).wait() for request in requests]
    assert [result.token_ids for result in results] == [result.token_ids for result in cold]


def test_a_waiting_request_is_placed_once_the_shared_beginning_is_stored(tmp_path: Path, model_path: Path) -> None:
    persona = ChatMessage.of(Role.SYSTEM, LONG_TEXT)
    with cached_engine(tmp_path / "kv", model_path, context=2048, sequences=3, n_batch=8, threads=1) as engine:
        long_request = GenerationRequest(
            tuple(engine.prompt_builder.build([persona, ChatMessage.of(Role.USER, LONG_TEXT)])), GREEDY
        )
        short_request = GenerationRequest(
            tuple(engine.prompt_builder.build([persona, ChatMessage.of(Role.USER, "How many?")])), GREEDY
        )
        with (
            engine.holding(Step.BATCH, 1, where=lambda request: request is long_request) as first_batch,
            engine.holding(Step.TOKEN, 1, where=lambda request: request is long_request) as first_long_token,
        ):
            long_handle = engine.generate(long_request)
            assert first_batch.wait_until_holding()
            short_handle = engine.generate(short_request)
            first_batch.release()
            assert first_long_token.wait_until_holding()
            # The short one restored the persona once the long one had computed it, and was
            # answered before the long prompt's end.
            assert short_handle.done
        short = short_handle.wait()
        long_handle.wait()
    shared = common_prefix_length(np.asarray(long_request.prompt_tokens), np.asarray(short_request.prompt_tokens))
    assert short.stats.reuse_tier == "ram"
    assert short.stats.reused_tokens >= shared - 16


def test_a_request_naming_a_sequence_keeps_it_while_it_waits(tmp_path: Path, model_path: Path) -> None:
    persona = ChatMessage.of(Role.SYSTEM, LONG_TEXT)
    with cached_engine(tmp_path / "kv", model_path, sequences=3, n_batch=8, threads=1) as engine:

        def asking(question: str, **options: object) -> GenerationRequest:
            tokens = tuple(engine.prompt_builder.build([persona, ChatMessage.of(Role.USER, question)]))
            return GenerationRequest(tokens, GREEDY, **options)  # type: ignore[arg-type]

        first, named = asking("Which is oldest?"), asking("Which is newest?", sequence=1)
        other = GenerationRequest(prompt(engine, "Name a colour."), SamplingParams(temperature=0.0, max_tokens=64))
        with engine.holding(Step.BATCH, 1, where=lambda request: request is first) as gate:
            handles = [engine.generate(first)]
            assert gate.wait_until_holding()
            handles += [engine.generate(named), engine.generate(other)]  # the named one waits for the persona
        results = [handle.wait() for handle in handles]  # none fails: the third kept off sequence 1
    assert all(result.stop_reason in (StopReason.LENGTH, StopReason.END) for result in results)
    assert results[1].stats.reuse_tier == "ram"  # it restored the persona the first one computed
