"""`chatapp ask`: one question, one streamed answer, one JSON record of what it cost.

The JSON fields are a contract that benchmarks and checks rely on: keep them stable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chatapp.documents import Document
from chatapp.engine.contract import EngineClient, SamplingParams
from chatapp.services.chat import ChatSession
from chatapp.services.conversation import Conversation
from chatapp.services.prompt_plan import TooLongWording
from chatapp.services.streams import AnswerText

CONTEXT_FIX = "a larger --context (context_cap in config.toml)"


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
    reply = session.send(request.question, _too_long(request))
    for event in reply.events():
        if isinstance(event, AnswerText) and event.text:
            on_text(event.text)
    ended = reply.ended
    assert ended is not None
    return {
        "answer": ended.text,
        **(ended.figures(ms_digits=3) or {}),
        "model": model,
        "model_fingerprint": model_fingerprint,
        "device": engine.info.device,  # where the offloaded layers ran ("CPU" when none were)
        "flash_attention": engine.info.flash_attention,  # as set, or as measured faster (flash_choice.py)
        "kv_type": engine.info.kv_type,  # the KV cells' number format (answers differ a little by type)
    }


def _too_long(request: AskRequest) -> TooLongWording:
    if request.document is None:
        return TooLongWording("the question", f"shorten it or use {CONTEXT_FIX}")
    return TooLongWording(
        f"document {request.document.name} with the question",
        f"use a shorter document or {CONTEXT_FIX}",
        about_document=True,
    )
