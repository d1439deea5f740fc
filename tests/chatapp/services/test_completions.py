"""The completion service on the bundled model: answers' ids found again by their text, refusals, stop strings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chatapp.engine.engine import Engine
from chatapp.engine.gate import Step
from chatapp.engine.requests import SamplingParams
from chatapp.prompting.planner import PromptPlan
from chatapp.services.completions import (
    ApiMessage,
    Completion,
    CompletionRequest,
    CompletionService,
    KeepHint,
    RequestError,
    ServerBusyError,
)
from chatapp.services.pins import PinAsked
from chatapp.store.answer_ids import AnswerIdStore
from chatapp.tools import ToolCall
from chatapp.vocabulary import Role, StopReason
from tests.service_support import Hold

# ignore_eos: every answer runs to its 12 tokens on every CPU (what the words are differs between CPUs).
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
QUESTION = (ApiMessage(Role.SYSTEM, "Answer briefly."), ApiMessage(Role.USER, "Which lighthouse is the oldest?"))


def finish(completion: Completion) -> str:
    text = "".join(getattr(event, "text", "") for event in completion.events())
    assert text == completion.outcome_for_client().text
    return text


def answered(service: CompletionService) -> tuple[str, tuple[int, ...]]:
    """The greedy answer to QUESTION: its text and its generated ids."""
    completion = service.start(CompletionRequest(GREEDY, messages=QUESTION))
    text = finish(completion)
    assert completion.result is not None
    return text, completion.result.token_ids


def test_an_answer_sent_back_as_text_gets_its_generated_ids(shared_engine: Engine, tmp_path: Path) -> None:
    store = AnswerIdStore(tmp_path / "answers")
    service = CompletionService(shared_engine, "model-a", store)
    answer, generated = answered(service)
    follow_up = (*QUESTION, ApiMessage(Role.ASSISTANT, answer), ApiMessage(Role.USER, "Why?"))
    assert service.chat_messages(follow_up)[2].generated_ids == generated
    store.close()

    # After a restart (a new store on the same folder) too; never for another model or history.
    reopened = AnswerIdStore(tmp_path / "answers")
    assert CompletionService(shared_engine, "model-a", reopened).chat_messages(follow_up)[2].generated_ids == generated
    assert CompletionService(shared_engine, "model-b", reopened).chat_messages(follow_up)[2].generated_ids is None
    other_history = (ApiMessage(Role.USER, "Something else?"), ApiMessage(Role.ASSISTANT, answer), QUESTION[1])
    assert CompletionService(shared_engine, "model-a", reopened).chat_messages(other_history)[1].generated_ids is None
    reopened.close()


def test_an_answer_cut_by_a_stop_string_keeps_the_ids_of_what_was_shown(shared_engine: Engine, tmp_path: Path) -> None:
    store = AnswerIdStore(tmp_path / "answers")
    service = CompletionService(shared_engine, "model-a", store)
    free, generated = answered(service)
    stop = _a_later_word(shared_engine, generated, free)  # from this CPU's answer
    completion = service.start(CompletionRequest(GREEDY, messages=QUESTION, stop=(stop,)))
    shown = finish(completion)
    assert shown == free[: free.index(stop)]
    outcome = completion.outcome_for_client()
    assert outcome.stop_reason is StopReason.STOP_STRING
    # Counted up to the token that ends the text shown, not the ones after the stop string.
    assert 0 < outcome.usage.completion_tokens < 12
    ids = service.chat_messages((*QUESTION, ApiMessage(Role.ASSISTANT, shown), QUESTION[1]))[2].generated_ids
    assert ids is not None
    assert shared_engine.model.detokenize(list(ids)) == shown
    store.close()


def _a_later_word(engine: Engine, token_ids: tuple[int, ...], text: str) -> str:
    """A token of the answer after its second that is a whole word with its space, first seen there in `text`:
    a stop string that cuts the answer exactly between two tokens, whatever words this CPU's answer has."""
    offset = 0
    for index, token in enumerate(token_ids):
        piece = engine.detokenize([token])
        if index >= 2 and re.fullmatch(r" [A-Za-z]{3,}", piece) and text.find(piece) == offset:
            return piece
        offset += len(piece)
    raise AssertionError(f"no word to stop at in {text!r}")


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (CompletionRequest(GREEDY), "messages is empty"),
        (CompletionRequest(GREEDY, messages=(*QUESTION, ApiMessage(Role.ASSISTANT, "Hi"))), "last message"),
        (CompletionRequest(GREEDY, prompt=""), "prompt is empty"),
    ],
)
def test_requests_that_cannot_be_served_are_refused(
    shared_engine: Engine, request_: CompletionRequest, message: str
) -> None:
    with pytest.raises(RequestError, match=message):
        CompletionService(shared_engine, "model-a").start(request_)


def test_past_the_pending_limit_requests_are_refused_until_one_ends(shared_engine: Engine, hold: Hold) -> None:
    service = CompletionService(shared_engine, "model-a", max_pending=1)
    gate = hold(Step.TOKEN, 2)
    running = service.start(CompletionRequest(GREEDY, messages=QUESTION))
    assert gate.wait_until_holding()
    with pytest.raises(ServerBusyError, match="limit is 1"):
        service.start(CompletionRequest(GREEDY, prompt="Hello"))
    running.cancel()
    finish(running)
    assert service.pending == 0
    finish(service.start(CompletionRequest(GREEDY, prompt="Hello")))
    assert service.pending == 0


def test_an_answer_ending_where_a_stop_string_might_begin_is_remembered_whole(
    shared_engine: Engine, tmp_path: Path
) -> None:
    store = AnswerIdStore(tmp_path / "answers")
    service = CompletionService(shared_engine, "model-a", store)
    free = finish(service.start(CompletionRequest(GREEDY, messages=QUESTION)))
    # A stop string that begins with the answer's last character: held back to the end, then released.
    completion = service.start(CompletionRequest(GREEDY, messages=QUESTION, stop=(free[-1] + "\u2603\u2603",)))
    assert finish(completion) == free
    assert completion.outcome_for_client().stop_reason is StopReason.LENGTH
    assert completion.result is not None
    follow_up = (*QUESTION, ApiMessage(Role.ASSISTANT, free), QUESTION[1])
    assert service.chat_messages(follow_up)[2].generated_ids == completion.result.token_ids
    shorter = (*QUESTION, ApiMessage(Role.ASSISTANT, free[:-1]), QUESTION[1])
    assert service.chat_messages(shorter)[2].generated_ids is None
    store.close()


def test_reasoning_stays_in_the_history_unless_told_to_go_as_the_template_would(shared_engine: Engine) -> None:
    """`chatapp serve --reasoning-history template`: answers before the latest question lose their
    <think> block (as Qwen 3's template writes them); the ones after it (an agent's tool loop) keep it."""
    thought = "<think>\nThe user greets me.\n</think>\n\nHello!"
    conversation = (
        ApiMessage(Role.USER, "Hi"),
        ApiMessage(Role.ASSISTANT, thought),
        ApiMessage(Role.USER, "Bye"),
        ApiMessage(Role.ASSISTANT, thought, tool_calls=(ToolCall("call_1", "answer", "{}"),)),
        ApiMessage(Role.TOOL, "42", tool_call_id="call_1"),
    )
    kept = CompletionService(shared_engine, "model-a").chat_messages(conversation)
    assert [message.content for message in kept][1::2] == [thought, thought]
    dropped = CompletionService(shared_engine, "model-a", keep_reasoning=False).chat_messages(conversation)
    assert dropped[1].content == "Hello!"
    assert dropped[3].content == thought, "after the latest question: kept"


def test_each_kept_beginning_pins_its_own_length_ttl_and_label_past_one_that_is_no_beginning() -> None:
    """A hint that covers no whole message of the app's (the planner's length 0) asks for nothing; the ones after
    it keep their own lengths, lifetimes and names."""
    request = CompletionRequest(
        GREEDY, messages=QUESTION * 2, keep=(KeepHint(1, 300.0), KeepHint(2, 3600.0), KeepHint(4, 300.0))
    )
    plan = PromptPlan(tuple(range(40)), kept=(0, 17, 33))
    asked = CompletionService._kept(request, plan)
    assert asked == (
        PinAsked(tuple(range(17)), 3600.0, "a request's prompt through message 2 of 4"),
        PinAsked(tuple(range(33)), 300.0, "a request's prompt through message 4 of 4"),
    )
