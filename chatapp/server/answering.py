"""What both APIs do with a completion: start it, follow it to its end or a disconnect, report it.

Starting (building the prompt, tokenizing a long system prompt) runs off the event loop.
A streamed answer begins once the engine has placed the prompt, so the response headers
already say what the cache did (`X-Chatapp-Cache`). A whole answer is awaited beside the
connection: a client that hangs up cancels its request and frees its sequence.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

from anyio import to_thread
from fastapi import Request

from chatapp.errors import ContextOverflowError
from chatapp.reasoning import Reasoning
from chatapp.server.cache_headers import CACHE_HEADER, cache_headers
from chatapp.server.context import RETRY_AFTER_SECONDS, ServerContext
from chatapp.server.errors import ApiError, context_overflow
from chatapp.server.feed import CompletionFeed
from chatapp.services.answer_shape import AnswerShape
from chatapp.services.completions import (
    ApiMessage,
    Completion,
    CompletionOutcome,
    KeepHint,
    RequestError,
    ServerBusyError,
)
from chatapp.services.divergence import Divergence
from chatapp.services.model_pool import UNCHANGED, KeepAlive
from chatapp.services.serving import SamplingOptions
from chatapp.services.streamed_answer import Shown, StreamedContent
from chatapp.services.streams import AnswerText, PromptReuse, StreamEvent
from chatapp.vocabulary import StopReason

# How the OpenAI and Ollama APIs name the end of an answer (StopReason is the app's one vocabulary).
FINISH_REASONS = {
    StopReason.END: "stop",
    StopReason.STOP_STRING: "stop",
    StopReason.LENGTH: "length",
    StopReason.CONTEXT: "length",
    StopReason.CANCELLED: "abort",  # the server stopped it (shutting down); vLLM's word
}


def finish_reason(reason: StopReason) -> str:
    """`finish_reason` (OpenAI) and `done_reason` (Ollama) for an answer that ended for `reason`."""
    return FINISH_REASONS.get(reason, "stop")


log = logging.getLogger(__name__)

T = TypeVar("T")
CLIENT_GONE = 499  # nginx's code for a client that closed the connection: nobody reads it
COMPACT = (",", ":")  # JSON separators for streamed events
# Characters some clients' line readers split a line at (Python's str.splitlines), though JSON allows them raw:
# written escaped, an event or an NDJSON line stays one line for every reader.
LINE_BREAKING = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def event_json(payload: object) -> str:
    """`payload` as one line of compact JSON for a stream (server-sent events, NDJSON)."""
    text = json.dumps(payload, ensure_ascii=False, separators=COMPACT)
    for raw, escaped in LINE_BREAKING.items():
        text = text.replace(raw, escaped)
    return text


async def start(start_completion: Callable[[], Completion]) -> CompletionFeed:
    """Start a completion off the loop; the service's refusals become 400 and 503."""
    try:
        completion = await to_thread.run_sync(start_completion)
    except RequestError as error:
        raise ApiError(400, str(error), param=error.param) from None
    except ContextOverflowError as error:
        raise context_overflow(str(error), error.prompt_tokens, error.context_tokens) from None
    except ServerBusyError as error:
        raise ApiError(503, str(error), kind="server_error", headers={"Retry-After": RETRY_AFTER_SECONDS}) from None
    return CompletionFeed(completion)


async def start_chat(
    context: ServerContext,
    model: str,
    messages: list[ApiMessage],
    options: SamplingOptions,
    stops: tuple[str, ...],
    shape: AnswerShape,
    keep_alive_s: KeepAlive = UNCHANGED,
    keep: tuple[KeepHint, ...] = (),
    reasoning: Reasoning | None = None,
) -> Answer:
    """A chat answer started on the model a request names (every API's chat route comes through here);
    `keep`: the prompt's beginnings the client asks to keep (Anthropic's cache_control), `reasoning`: the
    model's reasoning switch, as the request set it."""
    async with context.serving_for(model, keep_alive_s) as serving:
        return Answer(context, await start(lambda: serving.chat(messages, options, stops, shape, keep, reasoning)))


class Answer:
    """One completion followed by a route: its events, then its outcome (figures recorded once)."""

    def __init__(self, context: ServerContext, feed: CompletionFeed) -> None:
        self._context = context
        self.feed = feed
        self._events = aiter(feed)
        self._first: StreamEvent | None = None  # read by placed() and not yet handed on by events()
        self.reuse: PromptReuse | None = None  # what the cache gave, once placed() knows (a local engine)
        self._streamed: StreamedContent | None = None  # what shown() showed: the ids its calls were given

    async def placed(self, request: Request) -> dict[str, str] | None:
        """Wait until the engine has placed the prompt (or begun answering); the response's cache headers.

        None when the client hung up while the request waited its turn: it is cancelled, and
        its place in the queue is free again. A remote engine says what it reused only after the
        answer: its headers then say so (`tier=unknown`), and the usage at the end has the figures.
        """
        waiting = await self._unless_hung_up(request, anext(self._events), "while its request waited")
        if waiting is None:
            return None
        try:
            first = waiting.result()
        except StopAsyncIteration:
            return {}
        except BaseException:
            self.feed.close()
            raise
        if isinstance(first, PromptReuse):
            self.reuse = first
            reused = first.reused_tokens
            return cache_headers(reused, first.prompt_tokens, first.tier.value, self.divergence(reused))
        self._first = first
        return {CACHE_HEADER: "tier=unknown; the engine reports its reuse with the answer's usage"}

    async def events(self) -> AsyncIterator[StreamEvent]:
        """The events after placement; cancels the completion if the reader stops early."""
        try:
            if self._first is not None:
                first, self._first = self._first, None
                yield first
            async for event in self._events:
                yield event
        finally:
            self.feed.close()

    async def shown(self) -> AsyncIterator[Shown]:
        """The answer as a stream shows it (every API): the text as it comes, held back where a call may
        begin; each call as it is written where its format can be read so, else whole once the answer ended."""
        shown = self._streamed = self.feed.completion.streamed_content()
        async for event in self.events():
            if isinstance(event, AnswerText) and event.text:
                if text := shown.feed(event.text):
                    yield text
                for news in shown.calls():
                    yield news
        whole = self.feed.completion.shaped_answer()
        if rest := shown.rest(whole):
            yield rest
        for news in shown.ending(whole):
            yield news

    async def shown_text(self) -> AsyncIterator[str]:
        """Only the text of `shown()`: for a stream that sends the calls whole from the outcome (Ollama's)."""
        async for piece in self.shown():
            if isinstance(piece, str):
                yield piece

    async def to_end(self, request: Request) -> CompletionOutcome | None:
        """Wait for the whole answer; None when the client hung up first (the request is cancelled)."""

        async def drain() -> None:
            async for _ in self.events():
                pass

        draining = await self._unless_hung_up(request, drain(), "before its answer ended")
        if draining is None:
            return None
        draining.result()
        return self.outcome()

    async def _unless_hung_up(self, request: Request, work: Awaitable[T], when: str) -> asyncio.Future[T] | None:
        """`work` done, or None (the completion cancelled) when the client hangs up first."""
        working = asyncio.ensure_future(work)
        watching = asyncio.ensure_future(_until_disconnected(request))
        try:
            await asyncio.wait({working, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
        if working.done():
            return working
        self.feed.close()
        working.cancel()
        log.info("client hung up %s: request cancelled", when)
        return None

    def divergence(self, reused: int) -> Divergence | None:
        """Where the prompt left the earlier one its `reused` tokens came from, when that one is known."""
        divergence = self.feed.completion.divergence
        return divergence if divergence is not None and divergence.concerns(reused) else None

    def final_headers(self, outcome: CompletionOutcome) -> dict[str, str]:
        """The cache headers of a whole answer, from its final figures."""
        usage = outcome.usage
        divergence = self.divergence(usage.cached_tokens)
        return cache_headers(usage.cached_tokens, usage.prompt_tokens, usage.tier.value, divergence)

    def outcome(self) -> CompletionOutcome:
        """The answer as the client sees it (its calls with the ids a stream gave them), its figures recorded."""
        outcome = self.feed.completion.outcome_for_client()
        if self._streamed is not None:
            outcome = replace(outcome, tool_calls=self._streamed.as_streamed(outcome.tool_calls))
        usage = outcome.usage
        self._context.metrics.completion_ended(usage)
        log.info(
            "prompt %s tokens: %s reused (%s), %s computed; %s generated (%s); first token after %.0f ms",
            f"{usage.prompt_tokens:,}",
            f"{usage.cached_tokens:,}",
            usage.tier.value,
            f"{usage.computed_tokens:,}",
            f"{usage.completion_tokens:,}",
            outcome.stop_reason.value,
            usage.stats.ttft_ms,
        )
        if (divergence := self.divergence(usage.cached_tokens)) is not None:
            log.info("prompt %s", divergence.describe())
        return outcome


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
