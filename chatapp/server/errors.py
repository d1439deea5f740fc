"""Errors as API clients expect them: OpenAI's error object under /v1, Ollama's under /api.

Every failure a client can cause becomes a 4xx with a one-line message naming the problem
(and the parameter, where one is at fault); anything else is logged with its traceback and
answered with a 500 that says so, never with the traceback.
"""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

OLLAMA_PREFIX = "/api/"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's code for a prompt over the context
ANTHROPIC_PREFIX = "/v1/messages"
# Anthropic's error types by status (its clients read the type, Claude Code retries the overloaded ones).
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


class ApiError(Exception):
    """A request the server refuses, with the HTTP status and OpenAI's error type."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
        overflow: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind
        self.headers = headers or {}
        self.overflow = overflow  # (prompt tokens, context tokens) of a prompt that does not fit


def context_overflow(message: str, prompt_tokens: int, context_tokens: int) -> ApiError:
    """A prompt longer than the context, told as each API's clients recognise it (agents compact their
    history on it): OpenAI's code `context_length_exceeded`, Anthropic's "prompt is too long: N tokens > M
    maximum"."""
    return ApiError(400, message, param="messages", overflow=(prompt_tokens, context_tokens))


def error_body(path: str, error: ApiError) -> dict[str, object]:
    """The error object in the dialect of the route that failed."""
    if path.startswith(OLLAMA_PREFIX):
        return {"error": error.message}
    if path.startswith(ANTHROPIC_PREFIX):
        kind = ANTHROPIC_ERROR_TYPES.get(error.status, "invalid_request_error" if error.status < 500 else "api_error")
        message = error.message
        if error.overflow is not None:
            prompt, context = error.overflow
            message = f"prompt is too long: {prompt} tokens > {context} maximum ({message})"
        return {"type": "error", "error": {"type": kind, "message": message}}
    code = CONTEXT_LENGTH_EXCEEDED if error.overflow is not None else None
    return {"error": {"message": error.message, "type": error.kind, "param": error.param, "code": code}}


def error_response(path: str, error: ApiError) -> JSONResponse:
    return JSONResponse(error_body(path, error), status_code=error.status, headers=error.headers)


async def handle_api_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, ApiError)
    return error_response(request.url.path, error)


async def handle_http_error(request: Request, error: Exception) -> JSONResponse:
    """Starlette's own refusals (unknown route, wrong method) in the API's shape."""
    assert isinstance(error, StarletteHTTPException)
    if error.status_code == 404:
        message = f"no route {request.url.path}; see GET /v1/models, POST /v1/chat/completions or POST /api/chat"
    elif error.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = str(error.detail)
    kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    return error_response(request.url.path, ApiError(error.status_code, message, kind=kind))


async def handle_unexpected(request: Request, error: Exception) -> JSONResponse:
    log.exception("internal error on %s %s", request.method, request.url.path)
    message = f"internal error ({type(error).__name__}); the server log has the details"
    return error_response(request.url.path, ApiError(500, message, kind="server_error"))
