"""`chatapp ask`: one question, one streamed answer, one JSON record of what it cost.

The JSON fields are a contract that benchmarks and checks rely on: keep them stable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chatapp.documents import Document
from chatapp.engine.contract import EngineClient
from chatapp.engine.requests import SamplingParams
from chatapp.errors import ContextOverflowError, DocumentError
from chatapp.services.chat import ChatSession
from chatapp.services.conversation import Conversation, document_block
from chatapp.services.streams import AnswerText, stats_record


@dataclass(frozen=True)
class AskRequest:
    """One question with its persona, document and sampling."""

    question: str
    sampling: SamplingParams
    system_prompt: str | None = None
    document: Document | None = None
    use_cache: bool = True


def ask(
    engine: EngineClient,
    request: AskRequest,
    *,
    model: str,
    model_fingerprint: str,
    on_text: Callable[[str], None],
) -> dict[str, Any]:
    """Answer `request`, passing text to `on_text` as it comes; return the JSON record."""
    conversation = Conversation(system_prompt=request.system_prompt, document=request.document)
    session = ChatSession(engine, conversation, request.sampling, use_cache=request.use_cache)
    try:
        reply = session.send(request.question)
    except ContextOverflowError as error:
        if request.document is None:
            raise
        document_tokens = len(engine.tokenize(document_block(request.document)))
        raise DocumentError(
            f"document {request.document.name} is {document_tokens:,} tokens ({error.prompt_tokens:,} with the "
            f"question) but a conversation's context holds {error.context_tokens:,}; "
            "use a shorter document or a larger --context (context_cap in config.toml)"
        ) from None
    for event in reply.events():
        if isinstance(event, AnswerText) and event.text:
            on_text(event.text)
    result = reply.result
    assert result is not None
    return {
        "answer": result.text,
        **stats_record(result, ms_digits=3),
        "model": model,
        "model_fingerprint": model_fingerprint,
    }
