"""The ASGI application: the APIs, /health, /metrics, the Host, Origin and API key checks and the error shapes."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from chatapp import __version__
from chatapp.server import anthropic_api, llama_api, ollama_api, openai_api, responses_api, unsupported
from chatapp.server.access import cors_headers
from chatapp.server.context import ServerContext
from chatapp.server.errors import ApiError, error_response, handle_api_error, handle_http_error, handle_unexpected
from chatapp.server.metrics import CONTENT_TYPE

OPEN_ROUTES = frozenset({"/health"})


def create_app(context: ServerContext) -> FastAPI:
    """An app serving `context`; the caller owns the serving stack and closes it after the server stops."""
    app = FastAPI(title="chatapp", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.context = context
    app.include_router(openai_api.router)
    app.include_router(anthropic_api.router)
    app.include_router(responses_api.router)
    app.include_router(ollama_api.router)
    app.include_router(llama_api.router)
    app.include_router(unsupported.router)
    app.add_exception_handler(ApiError, handle_api_error)
    app.add_exception_handler(StarletteHTTPException, handle_http_error)
    app.add_exception_handler(Exception, handle_unexpected)

    @app.get("/health")
    async def health() -> dict[str, object]:
        return {"status": "ok", "model": context.serving.model.id, "pending": context.serving.completions.pending}

    @app.post("/chatapp/flush")
    def flush() -> dict[str, str]:
        """Wait until every answer so far is recomputed and stored (for benchmarks and scripts)."""
        context.serving.flush()
        return {"status": "flushed"}

    @app.get("/metrics")
    def metrics() -> Response:  # reads the cache's figures under its lock: run off the event loop
        return Response(context.metrics.text(), media_type=CONTENT_TYPE)

    @app.middleware("http")
    async def check_key_and_count(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        path = request.url.path
        origin = request.headers.get("origin")
        access = context.access
        refusal = access.host_refusal(request.headers.get("host"))
        if refusal is None and origin is not None and not access.origin_allowed(origin):
            refusal = access.origin_refusal(origin)
        if refusal is not None:
            response: Response = error_response(path, ApiError(403, refusal, kind="permission_error"))
        elif origin is not None and _is_preflight(request):
            requested = request.headers.get("access-control-request-headers", "")
            response = Response(status_code=204, headers=cors_headers(origin, requested))
        elif context.api_key is not None and path not in OPEN_ROUTES and not _authorized(request, context.api_key):
            response = error_response(
                path,
                ApiError(
                    401,
                    "missing or wrong API key; send the header 'Authorization: Bearer KEY' (or 'x-api-key: KEY') "
                    "with the server's key",
                    kind="authentication_error",
                ),
            )
        else:
            try:
                response = await call_next(request)
            except Exception as error:  # answered here, so an allowed page can read it and it is counted
                response = await handle_unexpected(request, error)
        if origin is not None and refusal is None:
            response.headers.update(cors_headers(origin))
        route = request.scope.get("route")
        template = getattr(route, "path", "other")
        context.metrics.requests.labels(template, str(response.status_code)).inc()
        return response

    return app


def _is_preflight(request: Request) -> bool:
    """A browser asking whether it may send a request (CORS): answered before the key is asked for."""
    return request.method == "OPTIONS" and "access-control-request-method" in request.headers


def _authorized(request: Request, key: str) -> bool:
    """`Authorization: Bearer KEY` (OpenAI, Ollama, Claude Code's auth token) or `x-api-key: KEY` (Anthropic's SDK),
    compared in constant time, so the time taken says nothing about how much of the key was right."""
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key.encode()):
        return True
    return hmac.compare_digest(request.headers.get("x-api-key", "").strip().encode(), key.encode())
