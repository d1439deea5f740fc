"""Completions for programs: what the HTTP API asks of the engine, in the app's own terms.

A chat request's messages become prompt tokens exactly as the app builds them (the model's
template, message by message, append-only), so a client that resends a conversation reuses
all of it. An answer's text that comes back in a later request is matched to the exact
token ids generated for it (`AnswerIdStore`), since tokenizing the text again may split it
otherwise and leave the cached prefix there. Stop strings are applied here; the engine
knows only token limits and end-of-generation tokens.

Requests run in the engine's queue. At most `max_pending` may be waiting or running: past
that, `ServerBusyError`, so a flood of clients meets a clear refusal instead of a queue that
grows without end.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import xxhash

from chatapp.engine.contract import EngineClient
from chatapp.engine.handle import GenerationHandle
from chatapp.engine.prompt import ChatMessage
from chatapp.engine.requests import SamplingParams
from chatapp.errors import ChatappError
from chatapp.services.answer_run import AnswerRun, EndedAnswer
from chatapp.services.divergence import Divergence, PromptLog
from chatapp.services.messages import Turn, conversation_messages
from chatapp.services.prompt_plan import PromptPlan, TooLongWording, plan_for, start_answer
from chatapp.services.streams import StreamEvent
from chatapp.store.answer_ids import AnswerIdStore
from chatapp.vocabulary import ReuseTier, Role, StopReason

TOO_LONG_CHAT = TooLongWording("the conversation", "send fewer or shorter messages")
TOO_LONG_PROMPT = TooLongWording("the prompt", "send a shorter prompt")


class RequestError(ChatappError):
    """The request cannot be served as asked (HTTP 400); `param` names the field at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ServerBusyError(ChatappError):
    """Too many requests are waiting; the client should retry shortly (HTTP 503)."""


@dataclass(frozen=True)
class ApiMessage:
    """One message of a chat request as the client sent it."""

    role: Role
    content: str


@dataclass(frozen=True)
class CompletionRequest:
    """A chat (`messages`) or a plain completion (`prompt`: text, or token ids), with sampling and stop strings."""

    sampling: SamplingParams
    messages: tuple[ApiMessage, ...] = ()
    prompt: str | tuple[int, ...] | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class CompletionUsage:
    """What the request cost: `cached_tokens` of `prompt_tokens` were reused from `tier`."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    tier: ReuseTier
    ttft_ms: float
    total_ms: float
    prefill_ms: float

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True)
class CompletionOutcome:
    """The answer as the client sees it (stop strings cut off) and why it ended."""

    text: str
    stop_reason: StopReason  # each API words it its own way
    usage: CompletionUsage


class HistoryDigest:
    """Keys for remembered answers: a running hash of the model and the messages so far.

    One pass over a conversation gives the key of each answer in it (the hash so far, plus
    the answer's text), instead of hashing the whole history again for every answer.
    """

    def __init__(self, model_fingerprint: str) -> None:
        self._hash = xxhash.xxh3_128()
        self._hash.update(_canonical(model_fingerprint))

    def add(self, message: ChatMessage) -> None:
        self._hash.update(_canonical([message.role.value, list(message.parts), message.generated_ids]))

    def answer_key(self, text: str) -> str:
        """The key of the answer `text` given after the messages added so far."""
        with_answer = self._hash.copy()
        with_answer.update(_canonical(text))
        return with_answer.hexdigest()


def _canonical(value: object) -> bytes:
    """JSON, one value per call: concatenations of these are unambiguous."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class Completion(AnswerRun):
    """One running completion: text events with stop strings applied, then `outcome_for_client()`.

    The API's sink: a chat answer's ids are remembered for the conversation's next request.
    """

    def __init__(
        self,
        service: CompletionService,
        handle: GenerationHandle,
        history: list[ChatMessage] | None,
        stops: tuple[str, ...],
        divergence: Divergence | None = None,
    ) -> None:
        super().__init__(handle, stops)
        self.divergence = divergence  # where the prompt left the closest earlier one, if it did
        self._service = service
        self._history = history  # None: a plain completion, whose answer is not remembered
        self._released = threading.Event()  # the pending slot is given back once

    def events(self) -> Iterator[StreamEvent]:
        try:
            yield from super().events()
        finally:
            self._release()

    def cancel(self) -> None:
        """Stop the request; its place among the pending ones is free at once (it ends at its next step)."""
        super().cancel()
        self._release()

    def outcome_for_client(self) -> CompletionOutcome:
        """The answer and its figures (after `events()`)."""
        ended = self.ended
        if ended is None or ended.result is None:
            raise RuntimeError("the completion has not ended yet: read its events first")
        stats = ended.result.stats
        usage = CompletionUsage(
            prompt_tokens=stats.prompt_tokens,
            cached_tokens=stats.reused_tokens,
            completion_tokens=ended.generated_tokens,
            tier=stats.reuse_tier,
            ttft_ms=stats.ttft_ms,
            total_ms=stats.total_ms,
            prefill_ms=stats.prefill_ms,
        )
        return CompletionOutcome(ended.text, ended.stop_reason, usage)

    def _keep_answer(self, answer: EndedAnswer) -> None:
        if self._history is None or answer.stop_reason is StopReason.CANCELLED:
            return  # a plain completion, or an answer the client abandoned
        if answer.token_ids is not None and answer.text:
            self._service.remember_answer(self._history, answer.text, answer.token_ids)

    def _release(self) -> None:
        if not self._released.is_set():
            self._released.set()
            self._service._finished()


@dataclass
class CompletionService:
    """Turns API requests into engine requests, and keeps the ids of the answers it gave."""

    engine: EngineClient
    model_fingerprint: str
    answer_ids: AnswerIdStore | None = None
    max_pending: int = 16
    _pending: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _prompts: PromptLog = field(init=False)

    def __post_init__(self) -> None:
        self._prompts = PromptLog(self.engine.detokenize)

    def start(self, request: CompletionRequest) -> Completion:
        """Queue `request`; RequestError, ContextOverflowError or ServerBusyError if it cannot be."""
        if request.prompt is not None:
            history = None
            plan = PromptPlan(tuple(self._plain_prompt(request.prompt)))
            wording = TOO_LONG_PROMPT
        else:
            history = self.chat_messages(request.messages)
            plan = plan_for(self.engine, history)
            wording = TOO_LONG_CHAT
        self._take_slot()
        try:
            handle = start_answer(self.engine, plan, request.sampling, wording)
        except BaseException:
            self._finished()
            raise
        return Completion(self, handle, history, request.stop, self._prompts.compare(list(plan.tokens)))

    def chat_messages(self, messages: tuple[ApiMessage, ...]) -> list[ChatMessage]:
        """The app's messages for a chat request; assistant turns get their generated ids back when known."""
        if not messages:
            raise RequestError("messages is empty; send at least one user message", "messages")
        if messages[-1].role is Role.ASSISTANT:
            raise RequestError(
                "the last message is an assistant message; end with a user (or system) message", "messages"
            )
        converted: list[ChatMessage] = []
        digest = HistoryDigest(self.model_fingerprint)
        for message in messages:
            ids = None
            if message.role is Role.ASSISTANT and self.answer_ids is not None and message.content:
                ids = self.answer_ids.recall(digest.answer_key(message.content))
            (chat_message,) = conversation_messages(None, None, [Turn(message.role, message.content, ids)])
            digest.add(chat_message)
            converted.append(chat_message)
        return converted

    def remember_answer(self, history: list[ChatMessage], text: str, token_ids: tuple[int, ...]) -> None:
        if self.answer_ids is None or not token_ids:
            return
        digest = HistoryDigest(self.model_fingerprint)
        for message in history:
            digest.add(message)
        self.answer_ids.remember(digest.answer_key(text), token_ids)

    @property
    def pending(self) -> int:
        """Requests waiting or running now."""
        return self._pending

    def _plain_prompt(self, prompt: str | tuple[int, ...]) -> list[int]:
        if not prompt:
            raise RequestError("prompt is empty; send some text to complete", "prompt")
        if self.engine.prompt_builder is None:
            raise RequestError(
                "this server's backend builds its own prompts (a chat API); use /v1/chat/completions", "prompt"
            )
        if isinstance(prompt, str):
            return self.engine.tokenize(prompt, add_special=True, parse_special=True)
        self.check_token_ids(prompt, "prompt")
        return list(prompt)

    def check_token_ids(self, tokens: Sequence[int], param: str) -> None:
        """RequestError naming `param` when an id is outside the vocabulary (unknown size: only negatives)."""
        vocabulary = self.engine.info.n_vocab
        outside = next((token for token in tokens if token < 0 or 0 < vocabulary <= token), None)
        if outside is not None:
            raise RequestError(
                f"{param} holds the token id {outside}, outside this model's vocabulary (0-{vocabulary - 1})", param
            )

    def _take_slot(self) -> None:
        with self._lock:
            if self._pending >= self.max_pending:
                raise ServerBusyError(
                    f"{self._pending} requests are already waiting or running (the limit is {self.max_pending}); "
                    "retry shortly"
                )
            self._pending += 1

    def _finished(self) -> None:
        with self._lock:
            self._pending -= 1
