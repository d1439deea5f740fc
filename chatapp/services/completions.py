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
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import xxhash

from chatapp.engine.contract import EngineClient, GenerationHandle, GenerationStats, SamplingParams
from chatapp.errors import ChatappError, GrammarError
from chatapp.prompting.chat_template import TemplateRenderError
from chatapp.prompting.planner import PromptPlan, PromptPlanner
from chatapp.prompting.prompt import ChatMessage, PromptBuilder
from chatapp.reasoning import Reasoning
from chatapp.services.answer_run import AnswerRun, EndedAnswer
from chatapp.services.answer_shape import FREE_TEXT, AnswerShape, ShapedAnswer, ShapeError, read_answer
from chatapp.services.answer_start import AnswerStart
from chatapp.services.divergence import Divergence
from chatapp.services.messages import Turn, conversation_messages
from chatapp.services.pins import PinAsked, RequestPins
from chatapp.services.prompt_plan import TooLongWording
from chatapp.services.streamed_answer import StreamedContent
from chatapp.services.streams import StreamEvent
from chatapp.store.answer_ids import AnswerIdStore
from chatapp.tools import ToolCall, ToolResult, canonical_json
from chatapp.vocabulary import ReuseTier, Role, StopReason

log = logging.getLogger(__name__)

TOO_LONG_CHAT = TooLongWording("the conversation", "send fewer or shorter messages")
TOO_LONG_PROMPT = TooLongWording("the prompt", "send a shorter prompt")
NO_REMOTE_COUNT = "this server's backend builds its own prompts, so their tokens cannot be counted here"
IGNORE_EOS_WITH_GRAMMAR = (
    "ignore_eos cannot be combined with tools, a response format or a grammar (a finished call or JSON value "
    "must end the answer); send one or the other"
)
GRAMMAR_TOO_BIG = (
    "simplify it (llama.cpp refuses grammars with very long repetitions, such as a pattern's {0,2000}, "
    "or too many rules)"
)
NO_REMOTE_SHAPES = (
    "this server answers through another server (--backend), which chatapp cannot hold to a call or a schema "
    "yet: tool calls and response formats need chatapp serve on a local model"
)


class RequestError(ChatappError):
    """The request cannot be served as asked (HTTP 400); `param` names the field at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ServerBusyError(ChatappError):
    """Too many requests are waiting; the client should retry shortly (HTTP 503)."""


@dataclass(frozen=True)
class ApiMessage:
    """One message of a chat request as the client sent it (an assistant's calls; the call a result answers)."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""
    where: str = (
        ""  # the request's field it came from, for errors ("messages[3]", "input[2]"); "" where it is its index
    )


@dataclass(frozen=True)
class KeepHint:
    """The client asks that the prompt's beginning, through its first `messages` messages, be kept for
    `ttl_s` seconds (Anthropic's `cache_control`): a pin on the cache, never a change to the answer."""

    messages: int
    ttl_s: float


@dataclass(frozen=True)
class CompletionRequest:
    """A chat (`messages`) or a plain completion (`prompt`: text, or token ids), with sampling and stop strings."""

    sampling: SamplingParams
    messages: tuple[ApiMessage, ...] = ()
    prompt: str | tuple[int, ...] | None = None
    stop: tuple[str, ...] = ()
    shape: AnswerShape = FREE_TEXT
    keep: tuple[KeepHint, ...] = ()
    reasoning: Reasoning | None = None  # None: as the model's template does by default


@dataclass(frozen=True)
class CompletionUsage:
    """What the request cost: the engine's figures, the answer's tokens as the client got them (stop
    strings cut off), and the beginning the client asked to keep (its last KeepHint), pinned."""

    stats: GenerationStats
    completion_tokens: int
    kept_tokens: int = 0

    @property
    def prompt_tokens(self) -> int:
        return self.stats.prompt_tokens

    @property
    def cached_tokens(self) -> int:
        """The prompt's beginning reused from the cache (`tier`)."""
        return self.stats.reused_tokens

    @property
    def computed_tokens(self) -> int:
        return self.stats.computed_tokens

    @property
    def tier(self) -> ReuseTier:
        return self.stats.reuse_tier


@dataclass(frozen=True)
class CompletionOutcome:
    """The answer as the client sees it (stop strings cut off, calls apart from the text) and why it ended."""

    text: str
    stop_reason: StopReason  # each API words it its own way
    usage: CompletionUsage
    tool_calls: tuple[ToolCall, ...] = ()


class HistoryDigest:
    """Keys for remembered answers: a running hash of the model and the messages so far.

    One pass over a conversation gives the key of each answer in it (the hash so far, plus
    the answer's text), instead of hashing the whole history again for every answer.
    """

    def __init__(self, model_fingerprint: str) -> None:
        self._hash = xxhash.xxh3_128()
        self._hash.update(_canonical(model_fingerprint))

    def add(self, message: ChatMessage) -> None:
        fields: list[object] = [message.role.value, list(message.parts), message.generated_ids]
        if message.tool_calls or message.results:  # only then: the keys of plain chats stay as they were
            fields.append([call.signature() for call in message.tool_calls])
            fields.append([[result.call_id, result.content] for result in message.results])
        self._hash.update(_canonical(fields))

    def answer_key(self, text: str) -> str:
        """The key of the answer `text` given after the messages added so far."""
        with_answer = self._hash.copy()
        with_answer.update(_canonical(text))
        return with_answer.hexdigest()


def reply_text(content: str, calls: Sequence[ToolCall]) -> str:
    """What identifies an answer when it comes back: its text, or its text and calls.

    Clients send a call back re-serialized (other spacing, content null or ""), so a call is
    known by its name and canonical arguments; the id this server gave it is not needed.
    """
    if not calls:
        return content
    return "\x00calls" + canonical_json([content.strip(), [list(call.signature()) for call in calls]])


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
        shape: AnswerShape = FREE_TEXT,
        builder: PromptBuilder | None = None,
        kept: tuple[PinAsked, ...] = (),
    ) -> None:
        super().__init__(handle, stops)
        self._kept = kept  # beginnings to pin once the answer ends (the prompt is stored by then)
        self.divergence = divergence  # where the prompt left the closest earlier one, if it did
        self.shaped: ShapedAnswer | None = None  # the answer read for calls, once it ended
        self._service = service
        self._history = history  # None: a plain completion, whose answer is not remembered
        self._shape = shape
        self._builder = builder
        self._released = threading.Event()  # the pending slot is given back once

    def events(self) -> Iterator[StreamEvent]:
        try:
            yield from super().events()
        finally:
            self._release()

    @property
    def kept_tokens(self) -> int:
        """The prompt's beginning the client asked to keep (the longest) and the cache pins, in tokens; 0 when
        none (or no cache keeps it)."""
        if self._service.pins is None:
            return 0
        return max((len(asked.tokens) for asked in self._kept), default=0)

    def streamed_content(self) -> StreamedContent:
        """What a stream may show of the text as it comes (held back where a call may begin)."""
        return StreamedContent(self._shape, self._builder)

    def shaped_answer(self) -> ShapedAnswer:
        """The answer read for calls (after `events()`)."""
        if self.shaped is None:
            raise RuntimeError("the completion has not ended yet: read its events first")
        return self.shaped

    def cancel(self) -> None:
        """Stop the request; its place among the pending ones is free at once (it ends at its next step)."""
        super().cancel()
        self._release()

    def outcome_for_client(self) -> CompletionOutcome:
        """The answer and its figures (after `events()`)."""
        ended = self.ended
        if ended is None or ended.result is None:
            raise RuntimeError("the completion has not ended yet: read its events first")
        usage = CompletionUsage(ended.result.stats, ended.generated_tokens, self.kept_tokens)
        shaped = self.shaped or ShapedAnswer(ended.text)
        return CompletionOutcome(shaped.content, ended.stop_reason, usage, shaped.calls)

    def _keep_answer(self, answer: EndedAnswer) -> None:
        if self._kept and self._service.pins is not None:
            self._service.pins.ask(self._kept)
        self.shaped = read_answer(answer.text, self._shape, self._builder)
        if self._history is None or answer.stop_reason is StopReason.CANCELLED:
            return  # a plain completion, or an answer the client abandoned
        if answer.token_ids is not None and answer.text and self.shaped.whole:
            reply = reply_text(self.shaped.content, self.shaped.calls)
            self._service.remember_answer(self._history, reply, answer.token_ids)

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
    # False: answers before the latest question lose their reasoning, as templates such as
    # Qwen 3's write the history; the prompt then changes from the first such answer on (a miss).
    keep_reasoning: bool = True
    pins: RequestPins | None = None  # where the beginnings requests ask to keep are pinned (None: ignored)
    _pending: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _answers: AnswerStart = field(init=False)

    def __post_init__(self) -> None:
        self._answers = AnswerStart(self.engine)

    def count_prompt(self, request: CompletionRequest) -> int:
        """How many tokens `request`'s prompt is, built as `start` would build it (nothing is computed)."""
        return len(self.prompt_tokens(request))

    def prompt_tokens(self, request: CompletionRequest) -> tuple[int, ...]:
        """`request`'s prompt, built as `start` would build it (nothing is computed)."""
        if self.engine.prompt_builder is None:  # a backend's chat API builds its prompts there: nothing to count
            raise RequestError(NO_REMOTE_COUNT, "messages")
        return tuple(self._prompt(request)[1].tokens)

    def _prompt(
        self, request: CompletionRequest
    ) -> tuple[list[ChatMessage] | None, PromptPlan, PromptBuilder | None, TooLongWording]:
        """The request's history (None for a plain completion), its prompt, the builder and how to word a refusal."""
        builder = self.engine.prompt_builder
        if request.prompt is not None:
            return None, PromptPlan(tuple(self._plain_prompt(request.prompt))), builder, TOO_LONG_PROMPT
        shape = request.shape
        history = self.chat_messages(request.messages)
        if builder is None and (shape.tools or shape.json_schema is not None or _has_tools(history)):
            raise RequestError(NO_REMOTE_SHAPES, "tools" if shape.tools else "messages")
        if builder is not None:
            builder = builder.with_reasoning(request.reasoning).with_tools(shape.tools)
        keep_through = [_chat_messages_in(request.messages, hint.messages) for hint in request.keep]
        try:
            plan = self._answers.plan(history, builder, keep_through)
        except TemplateRenderError as error:
            raise RequestError(str(error), "messages") from None
        return history, plan, builder, TOO_LONG_CHAT

    def start(self, request: CompletionRequest) -> Completion:
        """Queue `request`; RequestError, ContextOverflowError or ServerBusyError if it cannot be."""
        shape = request.shape
        history, plan, builder, wording = self._prompt(request)
        try:
            grammar = shape.grammar(builder) or request.sampling.grammar
        except ShapeError as error:
            raise RequestError(str(error), error.param) from None
        if grammar is not None and not self.engine.capabilities.grammars:
            raise RequestError(NO_REMOTE_SHAPES, _grammar_param(request))
        if grammar is not None and request.sampling.ignore_eos:
            # A grammar that is complete leaves only the end tokens, which ignore_eos forbids: nothing is left.
            raise RequestError(IGNORE_EOS_WITH_GRAMMAR, "ignore_eos")
        sampling = replace(request.sampling, grammar=grammar)
        kept = self._kept(request, plan)
        self._take_slot()
        try:
            started = self._answers.start(plan, sampling, wording)
        except GrammarError as error:  # llama.cpp refused what the converter wrote: the request's schema
            self._finished()
            param = _grammar_param(request)
            raise RequestError(f"{param}: {error}; {GRAMMAR_TOO_BIG}", param) from None
        except BaseException:
            self._finished()
            raise
        handle, divergence = started.handle, started.divergence
        if divergence is not None and builder is not None and history is not None:
            divergence = replace(divergence, place=self._place(builder, history, plan.tokens, divergence.position))
        chat_builder = builder if history is not None else None  # a plain completion's text is read as it is
        return Completion(self, handle, history, request.stop, divergence, shape, chat_builder, kept)

    @staticmethod
    def _kept(request: CompletionRequest, plan: PromptPlan) -> tuple[PinAsked, ...]:
        """The prompt's beginnings the request asks to keep, as tokens (the planner made them checkpoints too,
        where the model's state cannot be cut)."""
        return tuple(
            PinAsked(
                plan.tokens[:length],
                hint.ttl_s,
                f"a request's prompt through message {hint.messages} of {len(request.messages)}",
            )
            for hint, length in zip(request.keep, plan.kept, strict=False)
            if length
        )

    def _place(self, builder: PromptBuilder, history: list[ChatMessage], tokens: Sequence[int], position: int) -> str:
        """Where a prompt left an earlier one, in words; "" when that cannot be said (never a failed request)."""
        try:
            return PromptPlanner(builder).place_of(history, tokens, position)
        except Exception:
            log.warning("could not name where the prompt diverged", exc_info=True)
            return ""

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
        if not self.keep_reasoning:
            messages = _without_old_reasoning(messages)
        index = 0
        for group in _runs_of_results(messages):
            if isinstance(group, tuple):
                _check_results_answer_calls(group, converted, index)
                chat_message = ChatMessage(Role.TOOL, (), results=_results(group, converted))
                index += len(group)
            else:
                index += 1
                chat_message = self._chat_message(group, digest)
            digest.add(chat_message)
            converted.append(chat_message)
        return converted

    def _chat_message(self, message: ApiMessage, digest: HistoryDigest) -> ChatMessage:
        """One message; an assistant's gets its generated ids back when this server gave that answer."""
        ids = None
        reply = reply_text(message.content, message.tool_calls)
        if message.role is Role.ASSISTANT and self.answer_ids is not None and reply:
            ids = self.answer_ids.recall(digest.answer_key(reply))
        (chat_message,) = conversation_messages(None, None, [Turn(message.role, message.content, ids)])
        return replace(chat_message, tool_calls=message.tool_calls) if message.tool_calls else chat_message

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
        builder = self.engine.prompt_builder
        if builder is None:
            raise RequestError(
                "this server's backend builds its own prompts (a chat API); use /v1/chat/completions", "prompt"
            )
        if isinstance(prompt, str):
            return builder.tokenize(prompt, add_special=True, parse_special=True)
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


def _chat_messages_in(messages: Sequence[ApiMessage], count: int) -> int:
    """How many of the app's messages the first `count` request messages make (a run of tool results
    is one), counting only whole ones."""
    made = 0
    seen = 0
    for group in _runs_of_results(messages):
        seen += len(group) if isinstance(group, tuple) else 1
        if seen > count:
            break
        made += 1
    return made


def _grammar_param(request: CompletionRequest) -> str:
    """The field whose grammar llama.cpp refused."""
    shape = request.shape
    if shape.calls_tools:
        return "tools"
    return shape.schema_param if shape.json_schema is not None else "grammar"


def _runs_of_results(messages: Sequence[ApiMessage]) -> Iterator[ApiMessage | tuple[ApiMessage, ...]]:
    """The messages, a run of consecutive tool results as one tuple (templates render them together)."""
    run: list[ApiMessage] = []
    for message in messages:
        if message.role is Role.TOOL:
            run.append(message)
            continue
        if run:
            yield tuple(run)
            run = []
        yield message
    if run:
        yield tuple(run)


def _check_results_answer_calls(run: tuple[ApiMessage, ...], earlier: list[ChatMessage], index: int) -> None:
    """RequestError unless the tool results in `run` (from `messages[index]` on) answer calls of the assistant
    message just before them: a result of no call would reach the model as a reply to nothing."""
    calls = earlier[-1].tool_calls if earlier and earlier[-1].role is Role.ASSISTANT else ()
    if not calls:
        where = run[0].where or f"messages[{index}]"
        raise RequestError(
            f"{where} is a tool result but the message before it is not an assistant message with "
            "tool calls; send the assistant's call before its result",
            where,
        )
    ids = [call.id for call in calls]
    for offset, message in enumerate(run):
        if message.tool_call_id and message.tool_call_id not in ids:
            where = message.where or f"messages[{index + offset}]"
            raise RequestError(
                f"{where} answers the call {message.tool_call_id!r}, but the assistant message before it made "
                f"{', '.join(repr(call_id) for call_id in ids)}; send the id of the call it answers",
                f"{where}.tool_call_id" if not message.where else where,
            )


def _results(run: tuple[ApiMessage, ...], earlier: list[ChatMessage]) -> tuple[ToolResult, ...]:
    """Tool messages as results, each named after the call it answers (clients often send only the id) and
    with that call's id where the client sent none (Ollama's name only the function; some templates print
    the id, Mistral's refuse a result without one): the first call not answered yet, of that name if named."""
    names = {call.id: call.name for message in earlier for call in message.tool_calls}
    unanswered = list(earlier[-1].tool_calls) if earlier else []
    results = []
    for message in run:
        call_id = message.tool_call_id
        if not call_id:
            call = next((call for call in unanswered if call.name == message.name or not message.name), None)
            call_id = call.id if call is not None else ""
        unanswered = [call for call in unanswered if call.id != call_id]
        results.append(ToolResult(call_id, message.name or names.get(call_id, ""), message.content))
    return tuple(results)


def _has_tools(history: list[ChatMessage]) -> bool:
    return any(message.tool_calls or message.results for message in history)


REASONING_END = "</think>"


def _without_old_reasoning(messages: tuple[ApiMessage, ...]) -> tuple[ApiMessage, ...]:
    """The messages as a reasoning model's template writes them: answers before the latest question
    keep only what follows their reasoning (`</think>`)."""
    latest = max((index for index, message in enumerate(messages) if message.role is Role.USER), default=-1)
    return tuple(
        replace(message, content=message.content.split(REASONING_END)[-1].lstrip("\n"))
        if index < latest and message.role is Role.ASSISTANT and REASONING_END in message.content
        else message
        for index, message in enumerate(messages)
    )
