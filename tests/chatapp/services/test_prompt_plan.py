"""The prompt plan and the one refusal of a prompt that does not fit, on the bundled model."""

from __future__ import annotations

import pytest

from chatapp.engine.engine import Engine
from chatapp.engine.requests import SamplingParams
from chatapp.errors import ContextOverflowError, DocumentError
from chatapp.prompting.planner import PromptPlan, PromptPlanner
from chatapp.prompting.prompt import ChatMessage
from chatapp.services.answer_start import AnswerStart
from chatapp.services.prompt_plan import PromptTooLongError, TooLongWording, plan_for, prompt_too_long
from chatapp.vocabulary import Role

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)
WORDING = TooLongWording("this branch", "start a new conversation")


def test_the_refusal_names_what_both_numbers_and_the_fix() -> None:
    error = prompt_too_long(2_345, 1_024, WORDING)
    assert (
        str(error) == "this branch is 2,345 tokens but a conversation's context holds 1,024; start a new conversation"
    )
    assert (error.prompt_tokens, error.context_tokens) == (2_345, 1_024)
    assert isinstance(error, ContextOverflowError)
    assert not isinstance(error, DocumentError)
    about_document = prompt_too_long(2_345, 1_024, TooLongWording("document a.txt", "use a shorter one", True))
    assert isinstance(about_document, DocumentError)
    assert isinstance(about_document, PromptTooLongError)


def test_a_plan_is_the_builders_tokens_and_checkpoints_only_where_kept(shared_engine: Engine) -> None:
    messages = [ChatMessage.of(Role.SYSTEM, "Be brief."), ChatMessage.of(Role.USER, "Hello?")]
    plan = plan_for(shared_engine, messages)
    assert plan.tokens == tuple(shared_engine.prompt_builder.build(messages))
    assert not shared_engine.takes_checkpoints
    assert plan.checkpoints == ()
    with_points = PromptPlanner(shared_engine.prompt_builder).plan(messages, checkpoints=True)
    assert with_points.tokens == plan.tokens
    assert with_points.checkpoints
    assert all(0 < point < len(plan.tokens) for point in with_points.checkpoints)


def test_a_plan_that_does_not_fit_is_refused_in_the_callers_words(shared_engine: Engine) -> None:
    limit = shared_engine.info.n_ctx_per_sequence
    with pytest.raises(PromptTooLongError) as raised:
        AnswerStart(shared_engine).start(PromptPlan(tuple([1] * limit)), GREEDY, WORDING)
    assert str(raised.value) == (
        f"this branch is {limit:,} tokens but a conversation's context holds {limit:,}; start a new conversation"
    )
    fits = AnswerStart(shared_engine).start(PromptPlan(tuple([1] * 8)), GREEDY, WORDING).handle.wait()
    assert fits.stats.prompt_tokens == 8
