"""The chat service on a remote engine (a real `chatapp serve`): warm-ahead on a document, and an
answer the server drops midway kept and marked as failed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chatapp.engine.gate import Step
from chatapp.engine.remote import RemoteEngineError
from chatapp.services.chat_service import ChatService
from chatapp.services.library import open_library
from chatapp.services.startup import open_workspace
from chatapp.services.streams import AnswerText
from chatapp.vocabulary import MessageStatus, ReuseTier
from tests.server_support import Backend
from tests.service_support import settings

pytestmark = pytest.mark.slow
DOCUMENT = "Harbour log.\n\n" + "The lamp was lit at dusk and the fog horn sounded twice. " * 30


@pytest.fixture
def service(tmp_path: Path, model_path: Path, backend: Backend) -> Iterator[ChatService]:
    workspace = open_workspace(str(tmp_path / "data"), settings(model_path, **backend.settings()))
    library = open_library(workspace)
    chat = ChatService(workspace, library.conversations, library.personas, library.pins)
    chat.load_model()
    yield chat
    chat.close()
    library.close()


def test_warm_ahead_puts_an_opened_document_in_the_servers_cache(service: ChatService, tmp_path: Path) -> None:
    document = tmp_path / "log.txt"
    document.write_text(DOCUMENT, encoding="utf-8")
    service.new_conversation()
    _, document_tokens = service.attach_document(document)
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
    service.new_conversation()
    with backend.server.engine.holding(Step.TOKEN, 3) as gate:
        job = service.ask("Describe the lamp room in detail.")
        events = job.events()
        received = [next(events) for _ in range(3)]
        assert gate.wait_until_holding()
        backend.proxy.cut()
        with pytest.raises(RemoteEngineError, match="broke"):
            list(events)
    assert all(isinstance(event, AnswerText) for event in received)
    saved = service.view().messages[-1].record
    assert saved.status is MessageStatus.FAILED
    assert saved.content == "".join(event.text for event in received if isinstance(event, AnswerText))
    assert saved.content
    assert not saved.generated_ids  # ids streamed before a failure are not trusted: the text is tokenized
    again = service.ask("Describe it briefly.").wait()  # the next request tries again and works
    assert again.text
