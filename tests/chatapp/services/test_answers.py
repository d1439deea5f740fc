"""AnswerJob on the real bundled model: the assistant message is saved as it streams
('partial' from the first token), and ends complete, stopped or cut off with its ids and figures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chatapp.engine.engine import Engine
from chatapp.engine.gate import Step
from chatapp.services import answers
from chatapp.services.chat_service import ChatService
from chatapp.services.library import Library, open_library
from chatapp.services.startup import Workspace, open_workspace
from chatapp.services.streams import AnswerText, stats_record
from chatapp.vocabulary import MessageStatus, Role, StopReason
from tests.service_support import Hold, make_service, settings

LONG_ANSWER = "Tell me a very long story about a lighthouse keeper."


def open_service(data_dir: Path, model_path: Path, engine: Engine, **overrides: object) -> tuple[ChatService, Library]:
    workspace: Workspace = open_workspace(str(data_dir), settings(model_path, **overrides))
    library = open_library(workspace)
    return make_service(workspace, library, engine), library


@pytest.fixture
def opened(data_dir: Path, model_path: Path, shared_engine: Engine) -> Iterator[tuple[ChatService, Library]]:
    """A service whose answers may run long (200 tokens), so that there is time to stop them."""
    service, library = open_service(data_dir, model_path, shared_engine, max_tokens=200)
    yield service, library
    library.close()


def test_the_answer_is_saved_partial_on_the_first_token_and_refreshed_while_it_streams(
    opened: tuple[ChatService, Library], hold: Hold, monkeypatch: pytest.MonkeyPatch
) -> None:
    service, _ = opened
    monkeypatch.setattr(answers, "SAVE_EVERY_S", -1.0)  # save on every token
    service.current.new_conversation()
    hold(Step.TOKEN, 5)  # the answer cannot end before the cancel
    job = service.ask(LONG_ANSWER)
    before_streaming = job.answer  # read into a local: asserting on job.answer would narrow it for good
    assert before_streaming is None
    texts: list[str] = []
    ids: list[int] = []
    for event in job.events():
        if not isinstance(event, AnswerText):
            continue
        texts.append(event.text)
        ids.append(event.token_id)
        assert job.answer is not None
        saved = service.conversations.get_message(job.answer.id)
        assert (saved.role, saved.parent_id, saved.status) == (Role.ASSISTANT, job.question.id, "partial")
        assert saved.content == "".join(texts)
        assert saved.generated_ids == tuple(ids)
        assert saved.stats is None
        if len(texts) == 5:
            job.cancel()
    assert job.result is not None
    assert job.result.stop_reason == StopReason.CANCELLED
    assert job.answer is not None
    final = service.conversations.get_message(job.answer.id)
    assert final.status == "stopped"
    assert final.content == job.result.text
    assert final.stats == {**stats_record(job.result), "model": service.slot.model_label()}, (
        "the figures name the model"
    )
    assert len(service.conversations.children(job.question.id)) == 1, "one message, updated in place"


def test_stopping_mid_answer_keeps_what_was_said(opened: tuple[ChatService, Library], hold: Hold) -> None:
    service, _ = opened
    service.current.new_conversation()
    hold(Step.TOKEN, 3)
    job = service.ask(LONG_ANSWER)
    seen: list[str] = []
    for event in job.events():
        if isinstance(event, AnswerText):
            seen.append(event.text)
            if len(seen) == 3:
                job.cancel()
    result = job.result
    assert result is not None
    assert result.stop_reason == StopReason.CANCELLED
    assert len(result.token_ids) == 3
    assert job.answer is not None
    answer = service.conversations.get_message(job.answer.id)
    assert answer.status == "stopped"
    assert answer.content == result.text == "".join(seen) != ""
    assert answer.generated_ids == result.token_ids
    assert answer.stats is not None
    assert answer.stats["generated_tokens"] == len(result.token_ids)
    view = service.current.view()
    assert view.leaf.id == answer.id
    assert view.leaf.status == "stopped"
    # The conversation goes on after a stopped answer, with its exact ids in the next prompt.
    following = service.ask("Go on.")
    prompt = list(following.handle.request.prompt_tokens)
    sent_before = list(job.handle.request.prompt_tokens)
    assert prompt[: len(sent_before) + len(result.token_ids)] == sent_before + list(result.token_ids)
    following.cancel()
    following.wait()


def test_an_answer_abandoned_after_the_first_token_stays_saved_as_partial(
    opened: tuple[ChatService, Library], data_dir: Path, model_path: Path, shared_engine: Engine, hold: Hold
) -> None:
    """What a killed app leaves behind: the first token's save, never finished."""
    service, library = opened
    conversation_id = service.current.new_conversation().conversation.id
    hold(Step.TOKEN, 1)
    job = service.ask(LONG_ANSWER)
    events = job.events()
    first = next(event for event in events if isinstance(event, AnswerText))
    # The reader stops here (the app is killed); the engine is stopped and drained behind it.
    job.cancel()
    job.handle.wait()
    assert job.answer is not None
    answer_id = job.answer.id
    del events, job
    library.close()

    # After the restart the cut-off answer is on the branch, as far as it was saved.
    service, library = open_service(data_dir, model_path, shared_engine, max_tokens=200)
    try:
        view = service.current.open(conversation_id)
        saved = service.conversations.get_message(answer_id)
        assert saved.status == "partial"
        assert saved.content == first.text != ""
        assert saved.generated_ids == (first.token_id,)
        assert view.leaf.id == answer_id
        assert [m.record.role for m in view.messages] == ["user", Role.ASSISTANT]
    finally:
        library.close()


def test_an_answer_that_reaches_max_tokens_is_cut_off(data_dir: Path, model_path: Path, shared_engine: Engine) -> None:
    # Three tokens into a very long story: no CPU's greedy answer ends there (ask, unlike the APIs, has no
    # ignore_eos to force it; the story's end token is far behind the words at every one of its first steps).
    service, library = open_service(data_dir, model_path, shared_engine, max_tokens=3)
    try:
        service.current.new_conversation()
        job = service.ask(LONG_ANSWER)
        result = job.wait()
        assert result.stop_reason == StopReason.LENGTH
        assert len(result.token_ids) == 3
        assert job.answer is not None
        answer = service.conversations.get_message(job.answer.id)
        assert answer.status is MessageStatus.CUT_OFF is MessageStatus.after(StopReason.LENGTH)
        assert answer.content == result.text
        assert answer.generated_ids == result.token_ids
        assert answer.stats == {**stats_record(result), "model": service.slot.model_label()}
        assert answer.stats is not None
        assert answer.stats["prompt_tokens"] == len(job.handle.request.prompt_tokens)
    finally:
        library.close()
