"""The chat service on a remote engine (a real `chatapp serve`): warm-ahead on a document, and an
answer the server drops midway kept and marked as failed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from chatapp.engine.gate import Step
from chatapp.engine.remote import RemoteEngineError
from chatapp.engine.remote_chat import RemoteChatEngine
from chatapp.engine.remote_http import RemoteClient
from chatapp.services import startup
from chatapp.services.chat_service import ChatService
from chatapp.services.library import open_library
from chatapp.services.startup import open_workspace
from chatapp.services.streams import AnswerText
from chatapp.vocabulary import MessageStatus, ReuseTier
from tests.server_support import Backend
from tests.service_support import attach, settings

pytestmark = pytest.mark.slow
DOCUMENT = "Harbour log.\n\n" + "The lamp was lit at dusk and the fog horn sounded twice. " * 30


@contextmanager
def service_on(data: Path, model_path: Path, backend: Backend) -> Iterator[ChatService]:
    """The TUI's chat service with `backend` as its engine."""
    workspace = open_workspace(str(data), settings(model_path, **backend.settings()))
    library = open_library(workspace)
    chat = ChatService(workspace, library.conversations, library.personas, library.pins)
    try:
        chat.load_model()
        yield chat
    finally:
        chat.close()
        library.close()


@pytest.fixture
def service(tmp_path: Path, model_path: Path, backend: Backend) -> Iterator[ChatService]:
    with service_on(tmp_path / "data", model_path, backend) as chat:
        yield chat


def test_warm_ahead_puts_an_opened_document_in_the_servers_cache(service: ChatService, tmp_path: Path) -> None:
    document = tmp_path / "log.txt"
    document.write_text(DOCUMENT, encoding="utf-8")
    service.current.new_conversation()
    _, document_tokens = attach(service, document)
    warming = service.warm_ahead()
    assert warming is not None
    warming.wait()
    job = service.ask("When was the lamp lit?")
    result = job.wait()
    assert result.stats.reuse_tier is ReuseTier.SERVER
    # The whole prefix (persona, document) came from the server's cache: only the question was computed.
    assert result.stats.reused_tokens >= document_tokens
    assert result.stats.computed_tokens < 40
    assert service.figures.reused_tokens == result.stats.reused_tokens


def test_an_answer_the_server_drops_is_kept_and_marked_failed(service: ChatService, backend: Backend) -> None:
    service.current.new_conversation()
    with backend.server.engine.holding(Step.TOKEN, 3) as gate:
        job = service.ask("Describe the lamp room in detail.")
        events = job.events()
        received = [next(events) for _ in range(3)]
        assert gate.wait_until_holding()
        backend.proxy.cut()
        with pytest.raises(RemoteEngineError, match="broke"):
            list(events)
    assert all(isinstance(event, AnswerText) for event in received)
    saved = service.current.view().messages[-1].record
    assert saved.status is MessageStatus.FAILED
    assert saved.content == "".join(event.text for event in received if isinstance(event, AnswerText))
    assert saved.content
    assert not saved.generated_ids  # ids streamed before a failure are not trusted: the text is tokenized
    again = service.ask("Describe it briefly.").wait()  # the next request tries again and works
    assert again.text


@pytest.fixture
def chat_mode_service(
    tmp_path: Path, model_path: Path, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ChatService]:
    """The TUI's service on a backend driven by chat messages (as vLLM or Ollama would be)."""
    monkeypatch.setattr(startup, "connect_remote_engine", lambda config: RemoteChatEngine(RemoteClient(config)))
    with service_on(tmp_path / "chat-data", model_path, backend) as chat:
        yield chat


def test_in_chat_mode_a_branch_answers_and_warm_ahead_still_fills_the_servers_cache(
    chat_mode_service: ChatService, tmp_path: Path
) -> None:
    service = chat_mode_service
    assert service.startup_notices()[0].endswith(
        "chatapp sends it chat messages, and what it reuses is what it reports"
    )
    document = tmp_path / "log.txt"
    document.write_text(DOCUMENT.replace("dusk", "nightfall"), encoding="utf-8")
    service.current.new_conversation()
    view, tokens = service.attach_document(document)
    assert tokens is None, "the server alone knows the document's size in tokens"
    assert view.document is not None
    assert service.document_tokens(view.document) is None
    warming = service.warm_ahead()
    assert warming is not None
    warming.wait()
    first = service.ask("When was the lamp lit?")
    result = first.wait()
    assert result.text
    assert result.stats.reuse_tier is ReuseTier.SERVER
    # The persona and the document were in the server's cache: most of the prompt was reused.
    assert result.stats.reused_tokens > result.stats.prompt_tokens // 2
    assert first.answer is not None
    assert first.answer.generated_ids is None, "a chat API sends no ids: the answer is kept as text"

    # A second question on the branch, then an edit of the first (a sibling branch).
    follow_up = service.ask("And the fog horn?").wait()
    assert follow_up.stats.reused_tokens > result.stats.prompt_tokens // 2
    assert first.question is not None
    edited = service.edit(first.question.id, "Who lit the lamp?")
    edited.wait()
    assert edited.answer is not None
    assert edited.ended is not None
    assert edited.answer.status is MessageStatus.after(edited.ended.stop_reason)
    assert edited.answer.content == edited.ended.text != ""
    assert len(service.current.view().messages) == 2
