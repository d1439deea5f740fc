"""One answer run for every surface: stop strings and how an answer ended, the same in ask as in the API."""

from __future__ import annotations

import re

from chatapp.engine.engine import Engine
from chatapp.engine.requests import SamplingParams
from chatapp.services.chat import ChatSession
from chatapp.services.conversation import Conversation
from chatapp.services.prompt_plan import TooLongWording
from chatapp.vocabulary import MessageStatus, Role, StopReason

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)  # 12 tokens on every CPU
WORDING = TooLongWording("the question", "shorten it")
QUESTION = "Which lighthouse is the oldest?"


def answer(engine: Engine, stops: tuple[str, ...] = ()) -> tuple[ChatSession, str]:
    session = ChatSession(engine, Conversation(system_prompt="Answer briefly."), GREEDY, stops=stops)
    reply = session.send(QUESTION, WORDING)
    text = "".join(getattr(event, "text", "") for event in reply.events())
    return session, text


def test_a_stop_string_ends_an_answer_in_ask_as_in_the_api(shared_engine: Engine) -> None:
    _, free = answer(shared_engine)
    words = re.findall(r" [A-Za-z]{3,}", free)  # this CPU's answer: the stop string is taken from it
    assert len(words) >= 2, free
    stop = words[1]
    session, shown = answer(shared_engine, (stop,))
    assert shown == free[: free.index(stop)]
    kept = session.conversation.turns[-1]
    assert (kept.role, kept.text) == (Role.ASSISTANT, shown)
    # The ids kept spell exactly what was shown (or are left out when a token straddles its end).
    assert kept.generated_ids is None or shared_engine.detokenize(list(kept.generated_ids)) == shown


def test_one_vocabulary_for_how_an_answer_ended() -> None:
    assert MessageStatus.after(StopReason.STOP_STRING) is MessageStatus.COMPLETE
    assert MessageStatus.after(StopReason.FAILED) is MessageStatus.FAILED
    assert MessageStatus.after(StopReason.CANCELLED) is MessageStatus.STOPPED
    assert MessageStatus.after(StopReason.LENGTH) is MessageStatus.CUT_OFF


def test_a_cancelled_api_answer_is_not_reported_as_cut_at_a_limit() -> None:
    from chatapp.server.answering import finish_reason

    assert finish_reason(StopReason.CANCELLED) != finish_reason(StopReason.LENGTH)
    assert finish_reason(StopReason.STOP_STRING) == finish_reason(StopReason.END) == "stop"
