"""AnswerJob on the real bundled model: the assistant message is saved as it streams
('partial' from the first token), and ends complete, stopped or cut off with its ids and figures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chatapp.engine.engine import Engine
from chatapp.engine.events import STOP_CANCELLED, STOP_LENGTH, TokenText
from chatapp.services import answers
from chatapp.services.answers import STATUS_BY_STOP, stats_record
from chatapp.services.chat_service import ChatService
from chatapp.services.library import Library, open_library
from chatapp.services.startup import Workspace, open_workspace
from chatapp.store.records import ASSISTANT
from tests.service_support import make_service, settings

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
    opened: tuple[ChatService, Library], monkeypatch: pytest.MonkeyPatch
) -> None:
    service, _ = opened
    monkeypatch.setattr(answers, "SAVE_EVERY_S", -1.0)  # save on every token
    service.new_conversation()
    job = service.ask(LONG_ANSWER)
    assert job.answer is None
    texts: list[str] = []
    ids: list[int] = []
    for event in job.events():
        if not isinstance(event, TokenText):
            continue
        texts.append(event.text)
        ids.append(event.token_id)
        assert job.answer is not None
        saved = service.conversations.get_message(job.answer.id)
        assert (saved.role, saved.parent_id, saved.status) == (ASSISTANT, job.question.id, "partial")
        assert saved.content == "".join(texts)
        assert saved.generated_ids == tuple(ids)
        assert saved.stats is None
        if len(texts) == 5:
            job.cancel()
    assert job.result is not None and job.result.stop_reason == STOP_CANCELLED
    final = service.conversations.get_message(job.answer.id)
    assert final.status == "stopped" and final.content == job.result.text and final.stats == stats_record(job.result)
    assert len(service.conversations.children(job.question.id)) == 1, "one message, updated in place"


def test_stopping_mid_answer_keeps_what_was_said(opened: tuple[ChatService, Library]) -> None:
    service, _ = opened
    service.new_conversation()
    job = service.ask(LONG_ANSWER)
    seen: list[str] = []
    for event in job.events():
        if isinstance(event, TokenText):
            seen.append(event.text)
            if len(seen) == 3:
                job.cancel()
    result = job.result
    assert result is not None and result.stop_reason == STOP_CANCELLED
    assert 3 <= len(result.token_ids) < 200
    answer = service.conversations.get_message(job.answer.id)  # type: ignore[union-attr]
    assert answer.status == "stopped"
    assert answer.content == result.text == "".join(seen) != ""
    assert answer.generated_ids == result.token_ids
    assert answer.stats is not None and answer.stats["generated_tokens"] == len(result.token_ids)
    view = service.view()
    assert view.leaf.id == answer.id and view.leaf.status == "stopped"
    # The conversation goes on after a stopped answer, with its exact ids in the next prompt.
    following = service.ask("Go on.")
    prompt = list(following.handle.request.prompt_tokens)
    sent_before = list(job.handle.request.prompt_tokens)
    assert prompt[: len(sent_before) + len(result.token_ids)] == sent_before + list(result.token_ids)
    following.cancel()
    following.wait()


def test_an_answer_abandoned_after_the_first_token_stays_saved_as_partial(
    opened: tuple[ChatService, Library], data_dir: Path, model_path: Path, shared_engine: Engine
) -> None:
    """What a killed app leaves behind: the first token's save, never finished."""
    service, library = opened
    conversation_id = service.new_conversation().conversation.id
    job = service.ask(LONG_ANSWER)
    events = job.events()
    first = next(event for event in events if isinstance(event, TokenText))
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
        view = service.open(conversation_id)
        saved = service.conversations.get_message(answer_id)
        assert saved.status == "partial"
        assert saved.content == first.text != ""
        assert saved.generated_ids == (first.token_id,)
        assert view.leaf.id == answer_id
        assert [m.record.role for m in view.messages] == ["user", ASSISTANT]
    finally:
        library.close()


def test_an_answer_that_reaches_max_tokens_is_cut_off(data_dir: Path, model_path: Path, shared_engine: Engine) -> None:
    service, library = open_service(data_dir, model_path, shared_engine)
    try:
        service.new_conversation()
        job = service.ask(LONG_ANSWER)
        result = job.wait()
        assert result.stop_reason == STOP_LENGTH and len(result.token_ids) == 12
        answer = service.conversations.get_message(job.answer.id)  # type: ignore[union-attr]
        assert answer.status == "cut_off" == STATUS_BY_STOP[STOP_LENGTH]
        assert answer.content == result.text and answer.generated_ids == result.token_ids
        assert answer.stats == stats_record(result)
        assert answer.stats is not None and answer.stats["prompt_tokens"] == len(job.handle.request.prompt_tokens)
    finally:
        library.close()
