"""The OpenAI API: /v1/chat/completions, /v1/completions (whole or streamed as SSE) and /v1/models.

`usage.prompt_tokens_details.cached_tokens` is the number of prompt tokens the cache gave
(part of `prompt_tokens`, as OpenAI counts it), in streams too when
`stream_options.include_usage` asks for usage.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from chatapp.server.answering import CLIENT_GONE, Answer, event_json, finish_reason, start, start_chat
from chatapp.server.bodies import read_request, sampling_of
from chatapp.server.context import context_of
from chatapp.server.errors import ApiError
from chatapp.server.reasoning_fields import openai_reasoning
from chatapp.server.schemas import (
    COMPLETION_UNSUPPORTED,
    OPENAI_MESSAGE_UNSUPPORTED,
    OPENAI_UNSUPPORTED,
    ChatCompletionBody,
    CompletionBody,
    OpenAISampling,
    checked_stop,
    refuse_unsupported,
)
from chatapp.server.tool_fields import chat_message, openai_call, openai_shape
from chatapp.services.completions import ApiMessage, CompletionOutcome, CompletionUsage
from chatapp.services.streamed_answer import CallArguments, CallBegins, CallShown
from chatapp.vocabulary import StopReason

router = APIRouter(prefix="/v1")


def _usage(usage: CompletionUsage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


@router.get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    """The started model under each of its names, then every other model on this machine (loaded on use)."""
    listed = await to_thread.run_sync(context_of(request).pool.listed)
    return {
        "object": "list",
        "data": [
            {
                "id": row.name,
                "object": "model",
                "created": row.card.created,
                "owned_by": "chatapp",
                "max_model_len": row.card.context_tokens,  # vLLM's name: a client in front learns the context
            }
            for row in listed
        ],
    }


@router.post("/chat/completions")
async def chat_completions(request: Request) -> Response:
    context, body = await read_request(request, ChatCompletionBody)
    fields = body.fields_sent()
    refuse_unsupported(fields, OPENAI_UNSUPPORTED)
    context.check_model(body.model)
    shape = openai_shape(fields)
    messages = chat_messages(body)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    options = sampling_of(body, max_tokens)
    stop = checked_stop(body.stop, "stop")
    reasoning = openai_reasoning(fields.get("reasoning_effort"))
    answer = await start_chat(context, body.model, messages, options, stop, shape, reasoning=reasoning)
    return await _respond(request, body, answer, "chat.completion", "chatcmpl")


def chat_messages(body: ChatCompletionBody) -> list[ApiMessage]:
    """The request's messages, each checked, as the prompt is built from them."""
    return [
        chat_message(index, message.role, message.text(index), message.fields_sent(), OPENAI_MESSAGE_UNSUPPORTED)
        for index, message in enumerate(body.messages)
    ]


@router.post("/completions")
async def completions(request: Request) -> Response:
    context, body = await read_request(request, CompletionBody)
    refuse_unsupported(body.fields_sent(), COMPLETION_UNSUPPORTED)
    context.check_model(body.model)
    prompt: str | list[int]
    if isinstance(body.prompt, str):
        prompt = body.prompt
    elif body.prompt and all(isinstance(item, int) for item in body.prompt):
        prompt = [int(item) for item in body.prompt]
    elif len(body.prompt) == 1 and isinstance(body.prompt[0], str):
        prompt = body.prompt[0]
    else:
        raise ApiError(400, f"prompt lists {len(body.prompt)} prompts; send one per request", param="prompt")
    options = sampling_of(body, body.max_tokens)
    stop = checked_stop(body.stop, "stop")
    async with context.serving_for(body.model) as serving:
        answer = Answer(context, await start(lambda: serving.complete(prompt, options, stop)))
    return await _respond(request, body, answer, "text_completion", "cmpl")


async def _respond(request: Request, body: OpenAISampling, answer: Answer, kind: str, id_prefix: str) -> Response:
    response_id = f"{id_prefix}-{uuid.uuid4().hex}"
    created = int(time.time())
    model = body.model
    chat = kind == "chat.completion"
    headers = await answer.placed(request)
    if headers is None:
        return Response(status_code=CLIENT_GONE)
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        chunks = _chunks(answer, response_id, created, model, chat, include_usage)
        return StreamingResponse(
            chunks, media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"}
        )
    outcome = await answer.to_end(request)
    if outcome is None:
        return Response(status_code=CLIENT_GONE)
    usage = outcome.usage
    choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(outcome), "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": outcome.text}
        if outcome.tool_calls:
            choice["message"]["content"] = outcome.text or None  # OpenAI's calls come with null content
            choice["message"]["tool_calls"] = [openai_call(call) for call in outcome.tool_calls]
    else:
        choice["text"] = outcome.text
    payload = {
        "id": response_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": _usage(usage),
    }
    return JSONResponse(payload, headers=answer.final_headers(outcome))


async def _chunks(
    answer: Answer, response_id: str, created: int, model: str, chat: bool, include_usage: bool
) -> AsyncIterator[str]:
    """Server-sent events: the text as it comes, the finish reason, the usage if asked, [DONE]."""
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        payload = {"id": response_id, "object": kind, "created": created, "model": model, "choices": choices, **extra}
        return f"data: {event_json(payload)}\n\n"

    piece: Callable[[str, str | None], dict[str, Any]]
    if chat:
        yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])

        def piece(text: str, finish: str | None) -> dict[str, Any]:
            return {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish, "logprobs": None}
    else:

        def piece(text: str, finish: str | None) -> dict[str, Any]:
            return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}

    try:
        async for shown in answer.shown():
            if isinstance(shown, str):
                yield chunk([piece(shown, None)])
            elif (call := _call_delta(shown)) is not None:
                yield chunk([{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}])
        outcome: CompletionOutcome = answer.outcome()
    except Exception as error:  # headers are sent: the error goes in the stream, as OpenAI does
        failure = {"message": f"the answer failed ({type(error).__name__}: {error})", "type": "server_error"}
        yield f"data: {json.dumps({'error': {**failure, 'param': None, 'code': None}})}\n\n"
        return
    yield chunk([piece("", _finish(outcome))])
    if include_usage:
        yield chunk([], usage=_usage(outcome.usage))
    yield "data: [DONE]\n\n"


def _call_delta(news: CallShown) -> dict[str, Any] | None:
    """A call's streamed delta, as OpenAI sends them: its id and name first, then pieces of its arguments."""
    if isinstance(news, CallBegins):
        function = {"name": news.name, "arguments": ""}
        return {"index": news.index, "id": news.call_id, "type": "function", "function": function}
    if isinstance(news, CallArguments):
        return {"index": news.index, "function": {"arguments": news.text}}
    return None


def _finish(outcome: CompletionOutcome) -> str:
    """`finish_reason`: "tool_calls" when the answer made calls (and was not cut off), else how it ended."""
    if outcome.tool_calls and outcome.stop_reason not in (StopReason.LENGTH, StopReason.CONTEXT):
        return "tool_calls"
    return finish_reason(outcome.stop_reason)
