"""Reading a request body: bounded in size, valid JSON, the right shape, or a 4xx that says why."""

from __future__ import annotations

import json
from typing import Protocol, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from chatapp.server.context import ServerContext, context_of
from chatapp.server.errors import ApiError
from chatapp.services.serving import SamplingOptions

Body = TypeVar("Body", bound=BaseModel)


async def read_request(request: Request, model: type[Body]) -> tuple[ServerContext, Body]:
    """The server's context and the request's body as `model` (within the server's body limit)."""
    context = context_of(request)
    return context, await read_body(request, model, context.body_limit_bytes)


async def read_body(request: Request, model: type[Body], limit_bytes: int) -> Body:
    """The body as `model`; 413 past `limit_bytes`, 400 for bad JSON or a field of the wrong type."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise _too_large(limit_bytes)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit_bytes:
            raise _too_large(limit_bytes)
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ApiError(400, f"the request body is not valid JSON ({error}); send a JSON object") from None
    except RecursionError:
        raise ApiError(400, "the request body nests too deeply; send a flatter JSON object") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body is a JSON {type(data).__name__}; send a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        location = ".".join(str(part) for part in first["loc"])
        more = len(error.errors()) - 1
        suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        raise ApiError(400, f"{location or 'body'}: {first['msg']}{suffix}", param=location or None) from None


def _too_large(limit_bytes: int) -> ApiError:
    return ApiError(413, f"the request body is larger than {limit_bytes:,} bytes; send a shorter prompt")


class SamplingFields(Protocol):
    """The sampling fields the OpenAI, Responses and Anthropic bodies share, under the same names."""

    @property
    def temperature(self) -> float | None: ...

    @property
    def top_p(self) -> float | None: ...

    @property
    def seed(self) -> int | None: ...

    @property
    def ignore_eos(self) -> bool | None: ...


def sampling_of(body: SamplingFields, max_tokens: int | None, *, top_k: int | None = None) -> SamplingOptions:
    """What a body asks of sampling; `max_tokens` under the protocol's own name, `top_k` where it has one."""
    return SamplingOptions(
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        max_tokens=max_tokens,
        top_k=top_k,
        ignore_eos=bool(body.ignore_eos),
    )
