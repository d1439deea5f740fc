"""The one door answers start through: the plan, the fit check, the warm-up told, the prompts logged."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from chatapp.engine.engine import Engine
from chatapp.engine.requests import SamplingParams
from chatapp.prompting.planner import PromptPlan
from chatapp.prompting.prompt import ChatMessage
from chatapp.services.answer_start import AnswerStart
from chatapp.services.prompt_plan import PromptTooLongError, TooLongWording
from chatapp.services.warmup import Prewarmer
from chatapp.vocabulary import Role

ONE_TOKEN = SamplingParams(temperature=0.0, max_tokens=1)
WORDING = TooLongWording("this branch", "start a new conversation")


def _messages(persona: str, question: str) -> list[ChatMessage]:
    return [ChatMessage.of(Role.SYSTEM, persona), ChatMessage.of(Role.USER, question)]


def test_a_second_prompt_that_leaves_the_first_says_where(shared_engine: Engine) -> None:
    answers = AnswerStart(shared_engine)
    first = answers.plan(_messages("You are a keeper of lighthouses.", "Which is oldest?"))
    assert first.tokens == tuple(
        shared_engine.prompt_builder.build(_messages("You are a keeper of lighthouses.", "Which is oldest?"))
    )
    started = answers.start(first, ONE_TOKEN, WORDING)
    assert started.divergence is None, "nothing earlier to leave"
    assert started.handle.wait().stats.prompt_tokens == len(first.tokens)
    second = answers.plan(_messages("You are a keeper of windmills.", "Which is oldest?"))
    diverged = answers.start(second, ONE_TOKEN, WORDING)
    diverged.handle.wait()
    assert diverged.divergence is not None
    position = diverged.divergence.position
    assert first.tokens[:position] == second.tokens[:position]
    assert first.tokens[position] != second.tokens[position]


def test_a_prompt_that_does_not_fit_is_refused_and_not_logged(shared_engine: Engine) -> None:
    answers = AnswerStart(shared_engine)
    limit = shared_engine.info.n_ctx_per_sequence
    with pytest.raises(PromptTooLongError):
        answers.start(PromptPlan(tuple([1] * limit)), ONE_TOKEN, WORDING)
    # Had the refused prompt been logged, this one would leave it at token 4.
    fits = answers.start(PromptPlan((1, 1, 1, 1, 2, 2, 2, 2)), ONE_TOKEN, WORDING)
    fits.handle.wait()
    assert fits.divergence is None, "the refused prompt was never logged: nothing earlier to leave"
    again = answers.start(PromptPlan((1, 1, 1, 1, 3, 3)), ONE_TOKEN, WORDING)
    again.handle.wait()
    assert again.divergence is not None, "a started prompt is logged"
    assert again.divergence.position == 4


class _Heard(Prewarmer):
    """The real prewarmer, noting what it was told."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.heard: list[tuple[int, ...]] = []

    def before_send(self, prompt: Sequence[int]) -> None:
        self.heard.append(tuple(prompt))
        super().before_send(prompt)


def test_the_warm_up_hears_of_each_answer_before_it_starts(shared_engine: Engine) -> None:
    prewarmer = _Heard(shared_engine)
    answers = AnswerStart(shared_engine, prewarmer)
    plan = answers.plan(_messages("Talk of trains.", "Any?"))
    answers.start(plan, ONE_TOKEN, WORDING).handle.wait()
    assert prewarmer.heard == [plan.tokens]
