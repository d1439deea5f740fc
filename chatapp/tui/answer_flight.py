"""One answer in flight on the main screen, from Enter to its end, as one object with explicit states.

The screen starts an answer on the UI thread; a worker thread creates the job and reads its
events; Esc may come at any moment in between. What both threads share (the job, whether a
stop was asked for) lives here, behind a lock, so a stop pressed before the job exists still
cancels it the moment it does.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from enum import Enum, auto

from textual.widgets.markdown import MarkdownStream

from chatapp.services.answers import AnswerJob
from chatapp.tui.widgets import MessageView


class FlightState(Enum):
    STARTING = auto()  # the question is on screen; a worker is creating the job
    READING = auto()  # the job runs and reads its prompt: no answer text yet
    ANSWERING = auto()  # answer text is streaming in
    STOPPING = auto()  # Esc was pressed: the job ends as soon as the engine notices


@dataclass
class AnswerFlight:
    """The views, draft and job of the answer being produced.

    `views` (the question, when new, and the answer's placeholder) are taken off the screen,
    and `draft` is given back to the message box, if the answer never starts. `edited_id` is
    the question being edited: it stays an edit if sending fails. `set_aside` is what the box
    held before the edit began: it comes back once the edit has started (or, if the edit
    never starts, it is set aside again).
    """

    views: list[MessageView]
    draft: str
    edited_id: int | None = None
    set_aside: str = ""
    stream: MarkdownStream | None = None
    tokens: int = 0
    _job: AnswerJob | None = None
    _state: FlightState = FlightState.STARTING
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def state(self) -> FlightState:
        return self._state

    @property
    def job(self) -> AnswerJob | None:
        return self._job

    def started(self, job: AnswerJob) -> None:
        """Worker thread: the job exists; cancel it at once if Esc came first."""
        with self._lock:
            self._job = job
            stopping = self._state is FlightState.STOPPING
            if not stopping:
                self._state = FlightState.READING
        if stopping:
            job.cancel()

    def stop(self) -> None:
        """UI thread: ask the answer to stop (now, or as soon as its job exists)."""
        with self._lock:
            self._state = FlightState.STOPPING
            job = self._job
        if job is not None:
            job.cancel()

    def text_arrived(self) -> None:
        """UI thread: one more piece of answer text was shown."""
        self.tokens += 1
        with self._lock:
            if self._state is FlightState.READING:
                self._state = FlightState.ANSWERING
