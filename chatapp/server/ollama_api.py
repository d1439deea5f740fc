"""The Ollama API: /api/chat, /api/generate (NDJSON streams unless `stream` is false), /api/tags,
/api/show, /api/ps and /api/version.

Counts follow Ollama: `prompt_eval_count` is the prompt tokens computed for this request
(Ollama also leaves out what its cache held); `prompt_cache_count` adds the tokens the
cache gave, and `X-Chatapp-Cache` says the same in the headers. Durations are nanoseconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from chatapp import __version__
from chatapp.server import ollama_models
from chatapp.server.answering import CLIENT_GONE, Answer, event_json, finish_reason, start, start_chat
from chatapp.server.bodies import read_request
from chatapp.server.context import ServerContext, context_of
from chatapp.server.errors import ApiError
from chatapp.server.keep_alive import keep_alive_seconds
from chatapp.server.reasoning_fields import ollama_think
from chatapp.server.schemas import (
    OLLAMA_GENERATE_UNSUPPORTED,
    OLLAMA_OPTIONS_UNSUPPORTED,
    OLLAMA_UNSUPPORTED,
    Lenient,
    OllamaBase,
    OllamaChatBody,
    OllamaGenerateBody,
    checked_stop,
    refuse_unsupported,
)
from chatapp.server.tool_fields import chat_message, ollama_call, ollama_shape
from chatapp.services.completions import ApiMessage, CompletionOutcome
from chatapp.services.serving import SamplingOptions
from chatapp.vocabulary import Role

router = APIRouter(prefix="/api")
NDJSON = "application/x-ndjson"
NS_PER_MS = 1_000_000


def _now() -> str:
    return ollama_models.timestamp(time.time())


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": __version__}


@router.get("/tags")
async def tags(request: Request) -> dict[str, Any]:
    """Every model served here: the started one under each of its names, then the others on this machine."""
    listed = await to_thread.run_sync(context_of(request).pool.listed)
    return {"models": [ollama_models.tag(row.name, row.card) for row in listed]}


@router.get("/ps")
async def running(request: Request) -> dict[str, Any]:
    """The models loaded now, and when each is unloaded: oterm asks after every answer."""
    rows = context_of(request).pool.running()
    return {"models": [ollama_models.running(name, card, expires) for name, card, expires in rows]}


class OllamaShowBody(Lenient):
    model: str | None = None
    name: str | None = None  # what older clients send


@router.post("/show")
async def show(request: Request) -> dict[str, Any]:
    """What clients such as oterm ask before a chat: the model's details and what it can do."""
    context, body = await read_request(request, OllamaShowBody)
    name = body.model or body.name
    if not name:
        raise ApiError(400, "model is missing; name the model to show", param="model")
    context.check_model(name)
    return ollama_models.shown(await to_thread.run_sync(lambda: context.pool.card(name)))


def _checked(context: ServerContext, body: OllamaBase) -> tuple[SamplingOptions, tuple[str, ...]]:
    refuse_unsupported(body.fields_sent(), OLLAMA_UNSUPPORTED)
    context.check_model(body.model)
    options = body.options
    if options is None:
        return SamplingOptions(), ()
    refuse_unsupported(options.fields_sent(), OLLAMA_OPTIONS_UNSUPPORTED, prefix="options.")
    predict = options.num_predict
    if predict is not None and predict < 0:  # Ollama's -1 and -2 say 'no limit', as an absent num_predict does
        predict = None
    elif predict == 0:
        raise ApiError(400, "options.num_predict is 0; ask for at least one token", param="options.num_predict")
    sampling = SamplingOptions(
        temperature=options.temperature, top_p=options.top_p, top_k=options.top_k, seed=options.seed, max_tokens=predict
    )
    return sampling, checked_stop(options.stop, "options.stop")


async def _load_or_unload(context: ServerContext, body: OllamaBase, chat: bool) -> Response:
    """Ollama's way to load a model ahead (no messages) or unload it (no messages, keep_alive 0)."""
    keep_alive = keep_alive_seconds(body.keep_alive)
    if keep_alive == 0:
        context.check_model(body.model)
        await to_thread.run_sync(lambda: context.pool.unload(body.model))
        reason = "unload"
    else:
        async with context.serving_for(body.model, keep_alive):
            reason = "load"
    answer: dict[str, Any] = {"model": body.model, "created_at": _now()}
    answer |= {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return JSONResponse({**answer, "done_reason": reason, "done": True})


@router.post("/chat")
async def chat(request: Request) -> Response:
    context, body = await read_request(request, OllamaChatBody)
    options, stop = _checked(context, body)
    if not body.messages:
        return await _load_or_unload(context, body, chat=True)
    shape = ollama_shape(body.fields_sent())
    messages = [
        chat_message(index, message.role, message.content or "", message.fields_sent(), OLLAMA_UNSUPPORTED)
        for index, message in enumerate(body.messages)
    ]
    reasoning = ollama_think(body.fields_sent().get("think"))
    keep_alive = keep_alive_seconds(body.keep_alive)
    answer = await start_chat(context, body.model, messages, options, stop, shape, keep_alive, reasoning=reasoning)
    return await _respond(request, body, answer, chat=True)


@router.post("/generate")
async def generate(request: Request) -> Response:
    context, body = await read_request(request, OllamaGenerateBody)
    options, stop = _checked(context, body)
    refuse_unsupported(body.fields_sent(), OLLAMA_GENERATE_UNSUPPORTED)
    if not body.prompt and not body.system:  # Ollama's own test: an empty string, not blank space
        return await _load_or_unload(context, body, chat=False)
    if not body.prompt.strip():
        raise ApiError(400, "prompt is empty; send some text", param="prompt")
    if body.raw and body.fields_sent().get("format"):
        raise ApiError(400, "format needs the chat template: remove raw, or format", param="format")
    shape = ollama_shape({"format": body.fields_sent().get("format")})
    persona = [ApiMessage(Role.SYSTEM, body.system)] if body.system else []
    messages = [*persona, ApiMessage(Role.USER, body.prompt)]
    async with context.serving_for(body.model, keep_alive_seconds(body.keep_alive)) as serving:
        if body.raw:
            answer = Answer(context, await start(lambda: serving.complete(body.prompt, options, stop)))
        else:
            answer = Answer(context, await start(lambda: serving.chat(messages, options, stop, shape)))
    return await _respond(request, body, answer, chat=False)


def _piece(model: str, text: str, chat: bool, done: bool) -> dict[str, Any]:
    content: dict[str, Any] = {"message": {"role": "assistant", "content": text}} if chat else {"response": text}
    return {"model": model, "created_at": _now(), **content, "done": done}


def _final(model: str, outcome: CompletionOutcome, chat: bool, text: str, *, with_calls: bool) -> dict[str, Any]:
    usage = outcome.usage
    final = _piece(model, text, chat, True)
    if with_calls and outcome.tool_calls:
        final["message"]["tool_calls"] = [ollama_call(call) for call in outcome.tool_calls]
    return {
        **final,
        "done_reason": finish_reason(outcome.stop_reason),
        "total_duration": int(usage.stats.total_ms * NS_PER_MS),
        "load_duration": 0,
        "prompt_eval_count": usage.computed_tokens,
        "prompt_cache_count": usage.cached_tokens,
        "prompt_eval_duration": int(usage.stats.prefill_ms * NS_PER_MS),
        "eval_count": usage.completion_tokens,
        "eval_duration": int(max(usage.stats.total_ms - usage.stats.ttft_ms, 0) * NS_PER_MS),
    }


async def _respond(request: Request, body: OllamaBase, answer: Answer, *, chat: bool) -> Response:
    headers = await answer.placed(request)
    if headers is None:
        return Response(status_code=CLIENT_GONE)
    if body.stream:
        return StreamingResponse(_lines(answer, body.model, chat), media_type=NDJSON, headers=headers)
    outcome = await answer.to_end(request)
    if outcome is None:
        return Response(status_code=CLIENT_GONE)
    final = _final(body.model, outcome, chat, outcome.text, with_calls=True)
    return JSONResponse(final, headers=answer.final_headers(outcome))


async def _lines(answer: Answer, model: str, chat: bool) -> AsyncIterator[str]:
    """The answer as it comes (held back where a call may begin), then its calls, then the figures."""
    try:
        async for text in answer.shown_text():
            yield event_json(_piece(model, text, chat, False)) + "\n"
        outcome = answer.outcome()
    except Exception as error:  # the headers are sent: Ollama reports a failure as an error line
        yield json.dumps({"error": f"the answer failed ({type(error).__name__}: {error})"}) + "\n"
        return
    if outcome.tool_calls:  # Ollama sends the calls in a message of their own before the end
        calls = _piece(model, "", chat, False)
        calls["message"]["tool_calls"] = [ollama_call(call) for call in outcome.tool_calls]
        yield event_json(calls) + "\n"
    yield event_json(_final(model, outcome, chat, "", with_calls=False)) + "\n"
