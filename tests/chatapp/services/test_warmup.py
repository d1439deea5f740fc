"""Warm-ahead and type-ahead on the real bundled model: what is warmed, when it is cancelled, and
that typing with warm-ups sends the same prompt and gets the same answer as sending at once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chatapp.documents import Document
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.gate import Step
from chatapp.engine.handle import GenerationHandle
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.prompting.planner import PromptPlanner, settled_text
from chatapp.prompting.prompt import ChatMessage
from chatapp.services.conversation import Conversation
from chatapp.services.messages import document_block
from chatapp.services.warmup import Prewarmer
from chatapp.vocabulary import Role, StopReason
from tests.cache_support import cached_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
PERSONA = "You are a careful assistant. You answer questions about the document in two sentences."
DOCUMENT = Document(
    name="minutes.txt",
    text="\n".join(
        f"Item {n}: the committee reviewed budget line {n * 7} and agreed to revisit it in week {n + 2}."
        for n in range(1, 16)
    ),
)
QUESTION = (
    "Which budget lines did the committee agree to revisit, and in which weeks? "
    "Please list them in order, and tell me whether any of them are due before week 10."
)


@pytest.mark.parametrize(
    ("draft", "settled"),
    [
        ("", ""),
        ("Hello", ""),
        ("Hello ", "Hello "),
        ("Hello wor", "Hello "),
        ("Hello  wor", "Hello  "),
        ("two words  ", "two words  "),
        ("first line\nsec", "first line\n"),
        ("tab\tthen", "tab\t"),
        (" x", " "),
        ("Où est la gare ? Près d", "Où est la gare ? Près "),
    ],
)
def test_settled_text_ends_at_the_last_whitespace(draft: str, settled: str) -> None:
    assert settled_text(draft) == settled


def test_draft_prompt_drops_the_token_at_the_settled_boundary(engine: Engine) -> None:
    builder = engine.prompt_builder
    persona = [ChatMessage.of(Role.SYSTEM, PERSONA)]
    parts = (document_block(DOCUMENT),)
    empty = PromptPlanner(builder).draft_tokens(persona, parts, "Whi")  # nothing settled: nothing dropped
    assert empty == builder.draft_tokens(persona, ChatMessage.of(Role.USER, *parts, ""))
    typed = PromptPlanner(builder).draft_tokens(persona, parts, "Which budget li")
    assert typed == builder.draft_tokens(persona, ChatMessage.of(Role.USER, *parts, "Which budget "))[:-1]
    sent = builder.build([*persona, ChatMessage.of(Role.USER, *parts, QUESTION)])
    assert len(empty) < len(typed)
    assert sent[: len(typed)] == typed


@pytest.fixture(scope="module")
def small_batches(model_path: Path) -> Iterator[Engine]:
    """An engine of 32-token batches: a prompt of a few batches is short to compute (the test model's
    prefill is the slow part of these tests)."""
    with Engine(EngineConfig(model_path=model_path, context_cap=512, sequences=2, n_batch=32)) as engine:
        yield engine


def long_prompt(engine: Engine, topic: str) -> tuple[int, ...]:
    """Several prefill batches, so the warm-up is still running when the next call comes."""
    text = f"Notes on {topic}: " + f"the {topic} report lists one more finding for the audit. " * 4
    tokens = engine.prompt_builder.draft_tokens([], ChatMessage.of(Role.USER, text))
    assert engine.context.shape.n_batch < len(tokens) < engine.info.n_ctx_per_sequence - 64
    return tuple(tokens)


def finished(handle: GenerationHandle | None) -> str:
    assert handle is not None
    return handle.wait().stop_reason


def test_nothing_new_is_not_warmed_again(engine: Engine) -> None:
    prewarmer = Prewarmer(engine)
    tokens = tuple(
        engine.prompt_builder.draft_tokens([ChatMessage.of(Role.SYSTEM, PERSONA)], ChatMessage.of(Role.USER, "How "))
    )
    first = prewarmer.warm(tokens, store=False)
    assert first is not None
    assert prewarmer.warm(tokens, store=False) is None
    assert prewarmer.warm(tokens[:-2], store=False) is None  # a backspace adds nothing
    assert finished(first) == StopReason.PREFILLED
    longer = prewarmer.warm(tokens + tuple(engine.tokenize(" many")), store=False)
    assert finished(longer) == StopReason.PREFILLED
    assert not prewarmer.busy


def test_an_edit_to_earlier_text_cancels_the_running_warm_up(small_batches: Engine) -> None:
    engine = small_batches
    prewarmer = Prewarmer(engine)
    original = long_prompt(engine, "rivers")
    edited = long_prompt(engine, "lakes")
    with engine.holding(Step.BATCH, after=1) as gate:  # the first warm-up is still running at the edit
        stale = prewarmer.warm(original, store=False)
        assert gate.wait_until_holding()
        assert prewarmer.busy
        fresh = prewarmer.warm(edited, store=False)
        assert finished(stale) == StopReason.CANCELLED
    assert finished(fresh) == StopReason.PREFILLED
    # Extending the text is not an edit: the running warm-up is the start of the next one.
    extending = prewarmer.warm(original, store=False)
    extended = prewarmer.warm(original + tuple(engine.tokenize(" More.")), store=False)
    assert finished(extending) == StopReason.PREFILLED
    assert finished(extended) == StopReason.PREFILLED


def test_before_send_keeps_only_warm_ups_that_start_the_prompt(small_batches: Engine) -> None:
    engine = small_batches
    prewarmer = Prewarmer(engine)
    useful = long_prompt(engine, "forests")
    handle = prewarmer.warm(useful, store=False)
    prewarmer.before_send(useful + tuple(engine.tokenize(" Question?")))
    assert finished(handle) == StopReason.PREFILLED
    useless = long_prompt(engine, "deserts")
    with engine.holding(Step.BATCH, after=1) as gate:
        handle = prewarmer.warm(useless, store=False)
        assert gate.wait_until_holding()
        prewarmer.before_send(long_prompt(engine, "oceans"))
        assert finished(handle) == StopReason.CANCELLED
    assert not prewarmer.busy
    # What was cancelled may be warmed again (here queued behind an answer, then cancelled).
    with engine.holding(Step.TOKEN, after=1) as gate:
        blocker = engine.generate(
            GenerationRequest(long_prompt(engine, "hills"), SamplingParams(temperature=0.0, max_tokens=2))
        )
        again = prewarmer.warm(useless, store=False)
        assert again is not None
        assert gate.wait_until_holding()
        prewarmer.cancel()
    assert finished(again) == StopReason.CANCELLED  # ended by the engine once the answer before it is done
    blocker.wait()
    assert prewarmer.warm(useless, store=False) is not None
    prewarmer.wait()
    assert not prewarmer.busy


def test_typing_with_warm_ups_sends_the_same_prompt_and_gets_the_cold_answer(
    tmp_path: Path, model_path: Path, engine: Engine
) -> None:
    with cached_engine(tmp_path / "kv", model_path) as warm_engine:
        builder = warm_engine.prompt_builder
        conversation = Conversation(system_prompt=PERSONA, document=DOCUMENT)
        parts_before = (document_block(DOCUMENT),)
        prewarmer = Prewarmer(warm_engine)
        # Warm-ahead: persona and document as soon as the conversation opens, kept in the cache.
        prewarmer.warm(
            PromptPlanner(builder).draft_tokens(conversation.prompt_messages(), parts_before, ""), store=True
        )
        prewarmer.wait()
        warm_engine.flush_cache()
        assert warm_engine.cache is not None
        blocks_before_typing = len(warm_engine.cache.index)
        assert blocks_before_typing > 0
        # Type-ahead: the question revealed one character at a time, warmed after each settled word.
        warmed = 0
        for end in range(1, len(QUESTION) + 1):
            if QUESTION[end - 1].isspace():
                tokens = PromptPlanner(builder).draft_tokens(
                    conversation.prompt_messages(), parts_before, QUESTION[:end]
                )
                warmed += prewarmer.warm(tokens, store=False) is not None
                prewarmer.wait()
        assert warmed >= QUESTION.count(" ") - 2
        warm_engine.flush_cache()
        assert len(warm_engine.cache.index) == blocks_before_typing  # drafts stay out of RAM and disk
        conversation.add_user(QUESTION)
        prompt = tuple(builder.build(conversation.prompt_messages()))
        at_once = tuple(
            builder.build([ChatMessage.of(Role.SYSTEM, PERSONA), ChatMessage.of(Role.USER, *parts_before, QUESTION)])
        )
        assert prompt == at_once
        prewarmer.before_send(prompt)
        typed = warm_engine.generate(GenerationRequest(prompt, GREEDY)).wait()
        warm_engine.flush_cache()
        assert len(warm_engine.cache.index) > blocks_before_typing  # the sent prompt is stored...
        assert warm_engine.cache.stats()["requests"] == 1  # ...and the warm-ups were not counted
    assert typed.stats.reuse_tier == "device"
    assert typed.stats.reused_tokens >= len(prompt) - 12  # the last word, the closing and the header
    cold = engine.generate(GenerationRequest(prompt, GREEDY, use_cache=False)).wait()
    assert typed.token_ids == cold.token_ids
