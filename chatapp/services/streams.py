"""A running engine request as the services hand it out: events in the app's terms, an end, a cancel.

One shape for everything a caller follows (an answer saved to a conversation, a one-off reply
for `chatapp ask`, a warm-up): iterate `events()` on a worker thread, `cancel()` from any
thread, `wait()` for the end. Subclasses say what happens on each piece of text, at the end,
and when the request fails; the callers (the screens above all) see only these event types,
and the engine's event vocabulary (AnswerText, PromptProgress, PromptReuse), named here for them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from chatapp.engine.contract import (
    AnswerText,
    GenerationHandle,
    GenerationResult,
    PromptProgress,
    PromptReuse,
    StreamEvent,
)
from chatapp.vocabulary import StopReason


@dataclass(frozen=True)
class AnswerOutcome:
    """How an answer ended, in words the screens can show."""

    text: str
    stop_reason: StopReason
    figures: dict[str, Any]  # EndedAnswer.figures(): tokens reused and computed, tier, timings


def stats_record(result: GenerationResult, *, ms_digits: int = 1) -> dict[str, Any]:
    """The figures of an answer: kept with it in the database, printed by `ask --json`."""
    stats = result.stats
    return {
        "prompt_tokens": stats.prompt_tokens,
        "reused_tokens": stats.reused_tokens,
        "computed_tokens": stats.computed_tokens,
        "reuse_tier": stats.reuse_tier.value,
        "generated_tokens": stats.generated_tokens,
        "ttft_ms": round(stats.ttft_ms, ms_digits),
        "total_ms": round(stats.total_ms, ms_digits),
        "decode_tokens_per_s": round(stats.decode_tokens_per_s, 2),
        "stop_reason": result.stop_reason.value,
    }


class EngineStream:
    """Follows one engine request; `result` is set once `events()` is exhausted."""

    def __init__(self, handle: GenerationHandle) -> None:
        self.handle = handle
        self.result: GenerationResult | None = None

    @property
    def done(self) -> bool:
        """Whether the engine has finished with the request (its events may still be unread)."""
        return self.handle.done

    def cancel(self) -> None:
        """Stop as soon as possible; what was said so far is kept."""
        self.handle.cancel()

    def events(self) -> Iterator[StreamEvent]:
        """Progress and text until the request ends; raises what the engine raised."""
        try:
            for event in self.handle.events():
                if isinstance(event, AnswerText):
                    self._on_text(event)
                yield event
            result = self.handle.wait()
        except BaseException as error:
            self._on_failure(error)
            raise
        self.result = result
        self._on_end(result)

    def wait(self) -> GenerationResult:
        """Follow the request to its end and return its result."""
        deque(self.events(), maxlen=0)  # read to the end
        assert self.result is not None
        return self.result

    # What subclasses add.
    def _on_text(self, text: AnswerText) -> None:
        """Each piece of answer text, on the reading thread."""

    def _on_end(self, result: GenerationResult) -> None:
        """The request ended (completed, stopped or cut off)."""

    def _on_failure(self, error: BaseException) -> None:
        """The request failed (an Exception) or its reader stopped reading (GeneratorExit, the app closing)."""


__all__ = [
    "AnswerOutcome",
    "AnswerText",
    "EngineStream",
    "PromptProgress",
    "PromptReuse",
    "StreamEvent",
    "stats_record",
]
