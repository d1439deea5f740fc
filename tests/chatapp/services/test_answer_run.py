"""One answer run for every surface: stop strings and how an answer ended, the same in ask as in the API."""

from __future__ import annotations

import re
from dataclasses import replace

from chatapp.engine.engine import Engine
from chatapp.engine.requests import SamplingParams
from chatapp.prompting.chat_template import FALLBACK_CHATML
from chatapp.prompting.grammar import Grammar
from chatapp.prompting.planner import PromptPlanner
from chatapp.prompting.prompt import ChatMessage
from chatapp.services.answer_run import AnswerRun
from chatapp.services.answer_start import AnswerStart
from chatapp.services.chat import ChatSession
from chatapp.services.conversation import Conversation
from chatapp.services.prompt_plan import TooLongWording, builder_of
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


def run_to_end(
    engine: Engine, sampling: SamplingParams, turn_ends: tuple[str, ...], stops: tuple[str, ...] = ()
) -> tuple[str, StopReason]:
    """An answer to QUESTION whose prompt says its turn ends at `turn_ends` (as a template-less model's does)."""
    builder = builder_of(engine)
    plan = PromptPlanner(builder).plan([ChatMessage.of(Role.USER, QUESTION)], checkpoints=False)
    started = AnswerStart(engine).start(replace(plan, turn_ends=turn_ends), sampling, WORDING)
    run = AnswerRun(started.handle, stops)
    text = "".join(getattr(event, "text", "") for event in run.events())
    ended = run.ended
    assert ended is not None
    assert ended.text == text
    return text, ended.stop_reason


def test_a_turn_end_written_as_text_ends_the_answer_as_an_end_token_does(shared_engine: Engine) -> None:
    """The model writes `<|im_end|>` as text where it was given ChatML without knowing it: its turn ended."""
    forced = SamplingParams(temperature=0.0, max_tokens=40, grammar=Grammar('root ::= "Sure thing. END and on"'))
    assert run_to_end(shared_engine, forced, (" END",)) == ("Sure thing.", StopReason.END)
    assert run_to_end(shared_engine, forced, ()) == ("Sure thing. END and on", StopReason.END)
    # The client's own stop string, where a turn end is too: the client's (Anthropic names it back).
    assert run_to_end(shared_engine, forced, (" END",), stops=(" END",)) == ("Sure thing.", StopReason.STOP_STRING)


def test_ignore_eos_runs_past_a_turn_end_as_past_an_end_token(shared_engine: Engine) -> None:
    free, _ = run_to_end(shared_engine, GREEDY, ())
    words = re.findall(r" [A-Za-z]{3,}", free)  # this CPU's answer: the turn end is taken from it
    assert words, free
    assert run_to_end(shared_engine, GREEDY, (words[0],)) == (free, StopReason.LENGTH)


def test_only_the_fallback_template_has_turn_ends(shared_engine: Engine) -> None:
    assert builder_of(shared_engine).template.turn_ends == (), "SmolLM2's own template ends turns with its token"
    fallback = replace(builder_of(shared_engine).template, source=FALLBACK_CHATML)
    assert fallback.turn_ends == ("<|im_end|>", "<|im_start|>")
