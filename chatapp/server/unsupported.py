"""Routes of both APIs this server knows and does not serve: a 501 that says so, not a 404 "no route".

A client that finds an Ollama or OpenAI server may ask it for embeddings (a RAG tool, an
editor's codebase index); it should learn that this server does not compute them, in the
error shape of the API it called.
"""

from __future__ import annotations

from typing import NoReturn

from fastapi import APIRouter, Request

from chatapp.server.context import context_of
from chatapp.server.errors import ApiError

router = APIRouter()
NOT_IMPLEMENTED = 501


@router.post("/v1/embeddings", response_model=None)
@router.post("/api/embed", response_model=None)
@router.post("/api/embeddings", response_model=None)
async def embeddings(request: Request) -> NoReturn:
    model = context_of(request).serving.model.id
    raise ApiError(
        NOT_IMPLEMENTED,
        f"this server does not compute embeddings: it serves chat and text completions of {model!r}; "
        "ask an embedding model's server for embeddings",
        kind="not_supported_error",  # llama-server's type for the same refusal
    )
