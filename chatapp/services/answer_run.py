"""An answer being run: stop strings applied, how it ended named once, its end handed to the caller's sink.

Every surface follows an answer through `AnswerRun`; what differs is only what each keeps
(its sink, a subclass): `chatapp ask` keeps the answer in memory, the TUI saves it to the
database as it streams, the API remembers its ids and words the HTTP answer. So a stop
string, a cut-off answer, a stopped one and one whose engine failed midway end the same way
everywhere, named by one `StopReason`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from chatapp.engine.contract import GenerationHandle, GenerationResult
from chatapp.services.stop_strings import StopMatcher
from chatapp.services.streams import AnswerOutcome, AnswerText, EngineStream, StreamEvent, stats_record
from chatapp.vocabulary import StopReason


@dataclass(frozen=True)
class EndedAnswer:
    """An answer as its caller keeps it: the text shown, the ids that spell it, and why it ended."""

    text: str
    token_ids: tuple[int, ...] | None  # None when a token straddles the end of the text (a stop string cut it)
    stop_reason: StopReason
    generated_tokens: int  # tokens whose text the caller got
    result: GenerationResult | None  # the engine's own report (None when it failed midway)

    def figures(self, *, ms_digits: int = 1) -> dict[str, Any] | None:
        """The answer's figures, as saved with it and printed by `ask --json` (None after a failure)."""
        if self.result is None:
            return None
        record = stats_record(self.result, ms_digits=ms_digits)
        record["generated_tokens"] = self.generated_tokens
        record["stop_reason"] = self.stop_reason.value
        return record


class AnswerRun(EngineStream):
    """Follows one answer: text with stop strings held back and cut, then `ended` (or a failure).

    Subclasses are the sinks: `_keep_text` for each piece shown, `_keep_answer` at the end,
    `_keep_failure` when the engine failed midway (not when the reader stopped: the app closing).
    """

    def __init__(self, handle: GenerationHandle, stops: tuple[str, ...] = ()) -> None:
        super().__init__(handle)
        self.ended: EndedAnswer | None = None
        request = handle.request
        turn_ends = () if request.sampling.ignore_eos else request.turn_ends  # ignore_eos: to the limit
        self._client_stops = len(stops)  # listed first: a client's stop wins where a turn end is at the same place
        self._matcher = StopMatcher(stops + turn_ends)
        self._ids: list[int] = []
        self._length_after: list[int] = []  # characters of raw answer text after each token
        self._length = 0
        self._tail = ""  # text held back for a stop string, released when the answer ended

    def events(self) -> Iterator[StreamEvent]:
        """Reuse, progress and answer text; text stops before a stop string and the rest is dropped."""
        for event in super().events():
            if not isinstance(event, AnswerText):
                yield event
                continue
            shown = self._matcher.feed(event.text)
            if self._matcher.stopped:
                self.cancel()  # the engine stops at its next step; what it adds is not shown
            if shown or (event.token_id >= 0 and not self._matcher.stopped):
                piece = AnswerText(shown, event.token_id)  # an id without text yet still belongs to the answer
                self._keep_text(piece)
                yield piece
        if self._tail:
            yield AnswerText(self._tail, -1)

    def outcome(self) -> AnswerOutcome:
        """How the answer ended, in words the screens can show (after `events()` or `wait()`)."""
        ended = self.ended
        if ended is None:
            raise RuntimeError("the answer has not ended yet: read its events first")
        return AnswerOutcome(ended.text, ended.stop_reason, ended.figures() or {})

    @property
    def shown_text(self) -> str:
        """The answer's text released so far."""
        return self._matcher.shown

    def _on_text(self, text: AnswerText) -> None:
        self._length += len(text.text)
        if text.token_id >= 0:
            self._ids.append(text.token_id)
            self._length_after.append(self._length)

    def _on_end(self, result: GenerationResult) -> None:
        # What was held back for a stop string is part of the answer: release it first.
        self._tail = self._matcher.flush()
        stopped = self._matcher.stopped
        reason = result.stop_reason
        if stopped:
            turn_ended = (self._matcher.matched or 0) >= self._client_stops
            reason = StopReason.END if turn_ended else StopReason.STOP_STRING
        text = self._matcher.shown
        ids: tuple[int, ...] | None = self._ids_for(text, result.token_ids) if stopped else result.token_ids
        if text and not ids:
            ids = None  # the engine sent no ids (a chat API): the text is what is known
        generated = self._tokens_for(text, result.stats.generated_tokens) if stopped else result.stats.generated_tokens
        self.ended = EndedAnswer(text, ids, reason, generated, result)
        self._keep_answer(self.ended)

    def _on_failure(self, error: BaseException) -> None:
        if not isinstance(error, Exception):
            return  # the reader stopped (the app closing): what was saved stays as it was
        text = self._matcher.shown
        partial = EndedAnswer(text, self._ids_for(text, tuple(self._ids)), StopReason.FAILED, len(self._ids), None)
        self._keep_failure(error, partial)

    def _ids_for(self, text: str, token_ids: tuple[int, ...]) -> tuple[int, ...] | None:
        """The ids whose text is exactly `text`; None when a token straddles its end."""
        if not text:
            return ()
        for count, length in enumerate(self._length_after, start=1):
            if length == len(text):
                return token_ids[:count]
            if length > len(text):
                return None
        return None  # text after the last id (released at the end without a token of its own)

    def _tokens_for(self, text: str, generated: int) -> int:
        """Tokens the caller got: those up to the one that ends `text`."""
        if not text:
            return 0
        found = (count for count, length in enumerate(self._length_after, start=1) if length >= len(text))
        return next(found, generated)

    # The sink: what the caller keeps.
    def _keep_text(self, piece: AnswerText) -> None:
        """A piece of the answer as shown, on the reading thread."""

    def _keep_answer(self, answer: EndedAnswer) -> None:
        """The answer ended: completed, stopped, cut off at a limit or by a stop string."""

    def _keep_failure(self, error: Exception, partial: EndedAnswer) -> None:
        """The engine failed midway; `partial` is what was shown (the error still goes to the reader)."""
