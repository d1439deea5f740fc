"""The caller's side of a request: its events, its result, and a cancel button.

Every engine behind the contract (the local llama.cpp engine, a remote server) feeds one of
these from its own thread; the caller reads the events on another.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

from chatapp.engine.events import AnswerText, GenerationResult, PromptProgress, PromptReuse
from chatapp.engine.requests import GenerationRequest

EngineEvent = PromptReuse | PromptProgress | AnswerText


class GenerationHandle:
    """The caller's side of a running request: its events, its result, and a cancel button."""

    def __init__(self, request: GenerationRequest) -> None:
        self.request = request
        self.submitted_at = time.perf_counter()
        self.cancel_event = threading.Event()
        self._events: queue.Queue[EngineEvent | None] = queue.Queue()  # None: the end
        self._result: GenerationResult | None = None
        self._error: BaseException | None = None
        self._drained = False
        self._finished = threading.Event()

    @property
    def done(self) -> bool:
        """Whether the engine has finished with this request (its events may still be unread)."""
        return self._finished.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until `done` without reading the events (another thread may be reading them)."""
        return self._finished.wait(timeout)

    def cancel(self) -> None:
        """Stop as soon as possible; the result keeps what was generated so far."""
        self.cancel_event.set()

    def events(self) -> Iterator[EngineEvent]:
        """Progress and text events until the request ends; raises if it failed."""
        while not self._drained:
            event = self._events.get()
            if event is None:
                self._drained = True
                break
            yield event
        if self._error is not None:
            raise self._error

    def wait(self) -> GenerationResult:
        """Consume the remaining events and return the result."""
        for _ in self.events():
            pass
        assert self._result is not None
        return self._result

    # Engine side.
    def emit(self, event: EngineEvent) -> None:
        self._events.put(event)

    def finish(self, result: GenerationResult | None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self._events.put(None)
        self._finished.set()
