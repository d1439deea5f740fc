"""Anthropic's Messages API: POST /v1/messages (whole, or streamed with its typed events) and
POST /v1/messages/count_tokens, for Claude Code and the `anthropic` SDK.

The request rides the same answer pipeline as /v1/chat/completions (anthropic_fields.py
translates at the edge). Usage says what the cache did: `cache_read_input_tokens` were
reused, `cache_creation_input_tokens` computed now and kept for the next request (up to the
last `cache_control` breakpoint, which pins that beginning for 5 minutes or an hour),
`input_tokens` computed now after it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from chatapp.server import anthropic_fields as fields
from chatapp.server.answering import CLIENT_GONE, Answer, event_json, start_chat
from chatapp.server.bodies import read_request, sampling_of
from chatapp.server.errors import ApiError
from chatapp.server.reasoning_fields import anthropic_thinking
from chatapp.services.completions import CompletionOutcome, RequestError
from chatapp.services.streamed_answer import CallArguments, CallBegins

router = APIRouter(prefix="/v1")


@router.post("/messages")
async def messages(request: Request) -> Response:
    context, body = await read_request(request, fields.MessagesBody)
    context.check_model(body.model)
    shape = fields.anthropic_shape(body.fields_sent())
    as_sent = context.serving.options.prompts_as_sent
    chat, ends = fields.converted(body, as_sent)
    options = sampling_of(body, body.max_tokens, top_k=body.top_k)
    stops = body.stops()
    keep, reasoning = fields.keep_hints(body, chat, ends), anthropic_thinking(body.fields_sent().get("thinking"))
    answer = await start_chat(context, body.model, chat, options, stops, shape, keep=keep, reasoning=reasoning)
    message_id = f"msg_{uuid.uuid4().hex}"
    headers = await answer.placed(request)
    if headers is None:
        return Response(status_code=CLIENT_GONE)
    if body.stream:
        events = _events(answer, message_id, body.model, stops)
        return StreamingResponse(
            events, media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"}
        )
    outcome = await answer.to_end(request)
    if outcome is None:
        return Response(status_code=CLIENT_GONE)
    payload = {
        **_message(message_id, body.model),
        "content": fields.content_blocks(outcome),
        "stop_reason": fields.stop_reason(outcome),
        "stop_sequence": fields.matched_stop(outcome, stops),
        "usage": fields.final_usage(outcome.usage),
    }
    return JSONResponse(payload, headers=answer.final_headers(outcome))


@router.post("/messages/count_tokens")
async def count_tokens(request: Request) -> dict[str, int]:
    """The prompt's length as the model will see it (tools taught in it included); nothing is computed."""
    context, body = await read_request(request, fields.MessagesBase)
    context.check_model(body.model)
    shape = fields.anthropic_shape(body.fields_sent())
    chat = fields.api_messages(body, context.serving.options.prompts_as_sent)
    reasoning = anthropic_thinking(body.fields_sent().get("thinking"))
    async with context.serving_for(body.model) as serving:
        try:
            count = await to_thread.run_sync(lambda: serving.count_chat(chat, shape, reasoning))
        except RequestError as error:
            raise ApiError(400, str(error), param=error.param) from None
    return {"input_tokens": count}


def _message(message_id: str, model: str) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "model": model}


def _event(kind: str, payload: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {event_json({'type': kind, **payload})}\n\n"


async def _events(answer: Answer, message_id: str, model: str, stops: tuple[str, ...]) -> AsyncIterator[str]:
    """message_start, a text block as the text comes, each call as a tool_use block as it is written (its
    input as input_json_delta pieces), message_delta, message_stop."""
    placed = answer.reuse  # None for a remote engine: its figures come with message_delta
    kept = answer.feed.completion.kept_tokens
    start_usage = fields.usage(placed.prompt_tokens, placed.reused_tokens, kept=kept) if placed else fields.usage(0, 0)
    opening = {**_message(message_id, model), "content": [], "stop_reason": None, "stop_sequence": None}
    yield _event("message_start", {"message": {**opening, "usage": start_usage}})
    yield _event("ping", {})
    blocks = 0  # blocks begun; the last is open until its stop
    text_open = False
    try:
        async for piece in answer.shown():
            if isinstance(piece, str) and not text_open:
                yield _event("content_block_start", {"index": blocks, "content_block": {"type": "text", "text": ""}})
                text_open, blocks = True, blocks + 1
            if isinstance(piece, str):
                yield _event(
                    "content_block_delta", {"index": blocks - 1, "delta": {"type": "text_delta", "text": piece}}
                )
            elif isinstance(piece, CallBegins):
                if text_open:
                    yield _event("content_block_stop", {"index": blocks - 1})
                    text_open = False
                block = {"type": "tool_use", "id": piece.call_id, "name": piece.name, "input": {}}
                yield _event("content_block_start", {"index": blocks, "content_block": block})
                blocks += 1
            elif isinstance(piece, CallArguments):
                delta = {"type": "input_json_delta", "partial_json": piece.text}
                yield _event("content_block_delta", {"index": blocks - 1, "delta": delta})
            else:
                yield _event("content_block_stop", {"index": blocks - 1})
        outcome: CompletionOutcome = answer.outcome()
    except Exception as error:  # the headers are sent: the error goes in the stream, as Anthropic does
        message = f"the answer failed ({type(error).__name__}: {error})"
        yield _event("error", {"error": {"type": "api_error", "message": message}})
        return
    if text_open:
        yield _event("content_block_stop", {"index": blocks - 1})
    ended = {"stop_reason": fields.stop_reason(outcome), "stop_sequence": fields.matched_stop(outcome, stops)}
    yield _event("message_delta", {"delta": ended, "usage": fields.final_usage(outcome.usage)})
    yield _event("message_stop", {})
