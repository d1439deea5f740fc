"""llama-server's own API on `chatapp serve`: /props, /tokenize, /detokenize and /completion.

These are what a chatapp in front of this server (`--backend URL`) needs to keep prompts
append-only across the wire: the model's template and tokenizer to build prompts on the
client, and a completion endpoint that takes token ids and gives back the generated ids
(`return_tokens`) and what the cache reused (`timings.cache_n`), in llama-server's shapes, so
the same client serves llama-server and chatapp alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from chatapp.prompting.prompt import PromptBuilder
from chatapp.server.answering import CLIENT_GONE, Answer, event_json, start
from chatapp.server.bodies import read_request
from chatapp.server.context import context_of
from chatapp.server.errors import ApiError
from chatapp.server.schemas import checked_stop
from chatapp.services.answer_shape import AnswerGrammar, ShapeError, server_grammar
from chatapp.services.completions import CompletionOutcome, RequestError
from chatapp.services.serving import SamplingOptions
from chatapp.services.streams import AnswerText
from chatapp.vocabulary import StopReason


def _tokenizer(request: Request) -> PromptBuilder:
    """The model's tokenizer here; a backend that builds its own prompts has none."""
    builder = context_of(request).serving.engine.prompt_builder
    if builder is None:
        raise ApiError(
            404,
            "this server's backend builds its own prompts (a chat API), so it offers no /props, /tokenize, "
            "/detokenize or /completion; use /v1/chat/completions",
        )
    return builder


async def _shares_a_tokenizer(request: Request) -> None:
    """These endpoints need the model's tokenizer here."""
    _tokenizer(request)


router = APIRouter(dependencies=[Depends(_shares_a_tokenizer)])
# llama-server's names for how an answer ended.
STOP_TYPES = {
    StopReason.END: "eos",
    StopReason.STOP_STRING: "word",
    StopReason.LENGTH: "limit",
    StopReason.CONTEXT: "limit",
}


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    content: str
    add_special: bool = False
    parse_special: bool = True


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tokens: list[int]


class LlamaCompletionBody(BaseModel):
    """llama-server's /completion body: the fields chatapp honours; others are ignored, as llama-server does."""

    model_config = ConfigDict(extra="ignore")
    prompt: str | list[int]
    n_predict: int | None = Field(None, ge=-1)
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=5.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=-1)
    stop: list[str] | None = None
    ignore_eos: bool | None = None
    return_tokens: bool = False
    grammar: str | None = None
    grammar_lazy: bool = False
    grammar_triggers: list[GrammarTrigger] | None = None
    preserved_tokens: list[str] | None = None

    def answer_grammar(self) -> AnswerGrammar | None:
        """The grammar asked for (llama-server's fields); a 400 naming what cannot be honoured."""
        if not self.grammar:
            return None
        triggers = [(trigger.type, trigger.value) for trigger in self.grammar_triggers or []]
        try:
            preserved = tuple(self.preserved_tokens or ())
            return server_grammar(self.grammar, lazy=self.grammar_lazy, triggers=triggers, preserved=preserved)
        except ShapeError as error:
            raise ApiError(400, str(error), param=error.param) from None


class GrammarTrigger(BaseModel):
    type: int
    value: str


@router.get("/props")
async def props(request: Request) -> dict[str, Any]:
    return context_of(request).serving.props()


@router.post("/tokenize")
async def tokenize(request: Request) -> dict[str, Any]:
    _, body = await read_request(request, TokenizeBody)
    builder = _tokenizer(request)
    tokens = await to_thread.run_sync(
        lambda: builder.tokenize(body.content, add_special=body.add_special, parse_special=body.parse_special)
    )
    return {"tokens": tokens}


@router.post("/detokenize")
async def detokenize(request: Request) -> dict[str, Any]:
    context, body = await read_request(request, DetokenizeBody)
    try:
        context.serving.completions.check_token_ids(body.tokens, "tokens")
    except RequestError as error:
        raise ApiError(400, str(error), param=error.param) from None
    builder = _tokenizer(request)
    return {"content": await to_thread.run_sync(lambda: builder.detokenize(body.tokens))}


@router.post("/completion")
async def completion(request: Request) -> Response:
    context, body = await read_request(request, LlamaCompletionBody)
    if isinstance(body.prompt, list) and not body.prompt:
        raise ApiError(400, "prompt is empty; send token ids or text to complete", param="prompt")
    options = SamplingOptions(
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed if body.seed is not None and body.seed >= 0 else None,
        max_tokens=body.n_predict if body.n_predict is not None and body.n_predict >= 0 else None,
        ignore_eos=bool(body.ignore_eos),
    )
    stop = checked_stop(body.stop, "stop")
    serving = context.serving
    prompt = body.prompt
    grammar = body.answer_grammar()
    answer = Answer(context, await start(lambda: serving.complete(prompt, options, stop, grammar)))
    headers = await answer.placed(request)
    if headers is None:
        return Response(status_code=CLIENT_GONE)
    if body.stream:
        return StreamingResponse(
            _chunks(answer, body.return_tokens),
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache"},
        )
    text, tokens = [], []
    async for event in answer.events():
        if isinstance(event, AnswerText):
            text.append(event.text)
            if event.token_id >= 0:
                tokens.append(event.token_id)
    outcome = answer.outcome()
    payload = {"content": "".join(text), **_final(outcome)}
    if body.return_tokens:
        payload["tokens"] = tokens
    return JSONResponse(payload, headers=answer.final_headers(outcome))


def _final(outcome: CompletionOutcome) -> dict[str, Any]:
    """How the answer ended and what it cost, in llama-server's words (`cache_n`: prompt tokens reused)."""
    usage = outcome.usage
    return {
        "stop": True,
        "stop_type": STOP_TYPES.get(outcome.stop_reason, "none"),
        "tokens_evaluated": usage.prompt_tokens,
        "tokens_predicted": usage.completion_tokens,
        "timings": {
            "cache_n": usage.cached_tokens,
            "prompt_n": usage.computed_tokens,
            "prompt_ms": usage.stats.prefill_ms,
            "predicted_n": usage.completion_tokens,
            "predicted_ms": max(usage.stats.total_ms - usage.stats.ttft_ms, 0.0),
        },
    }


async def _chunks(answer: Answer, return_tokens: bool) -> AsyncIterator[str]:
    """One event per piece of text (with its token id when asked), then the final report."""

    def event(payload: dict[str, Any]) -> str:
        return f"data: {event_json(payload)}\n\n"

    try:
        async for item in answer.events():
            if not isinstance(item, AnswerText):
                continue
            payload: dict[str, Any] = {"content": item.text, "stop": False}
            if return_tokens:
                payload["tokens"] = [item.token_id] if item.token_id >= 0 else []
            yield event(payload)
        outcome = answer.outcome()
    except Exception as error:  # headers are sent: the error goes in the stream, as llama-server does
        yield event({"error": {"code": 500, "message": f"the answer failed ({type(error).__name__}: {error})"}})
        return
    yield event({"content": "", **_final(outcome)})
