"""Switching models from the chat screen: load the new one beside the old, then swap.

The model answering keeps answering while the new one loads (progress in the prefill row,
Esc cancels). Once loaded, the switch waits for an answer in flight to end; writing the old
model's cache and closing it run off the UI thread. The Textual layer only drives the
service here: the engines stay inside it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from textual.timer import Timer

from chatapp.errors import ChatappError, LoadCancelled
from chatapp.services.chat_service import ChatService
from chatapp.services.model_choice import file_fit_problem
from chatapp.tui.chat_widgets import ChatWidgets
from chatapp.tui.widgets import PrefillRow, StatusLine

PROGRESS_EVERY_S = 0.1  # how often the progress row shows the share loaded
# A load shorter than this shows no progress bar: it would only flash, and drawing it (a layout of
# the screen each time the row shows or hides) competes with the load for the GIL and the cores.
PROGRESS_AFTER_S = 0.5


class ModelSwitch:
    """One switch at a time; a newer choice cancels the load of an older one."""

    def __init__(
        self, widgets: ChatWidgets, service: ChatService, answering: Callable[[], bool], ready: Callable[[str], None]
    ) -> None:
        self._widgets = widgets
        self._service = service
        self._answering = answering
        self._ready = ready  # the screen's engine_ready: status line, context size, warm-up
        self._cancel: threading.Event | None = None
        self._target: Path | None = None
        self._waiting = False  # loaded, waiting for the answer in flight to end
        self._share = 0.0  # of the weights loaded, written by the load's thread
        self._started = 0.0  # when the load began (time.monotonic)
        self._timer: Timer | None = None

    @property
    def loading(self) -> bool:
        return self._cancel is not None and not self._cancel.is_set()

    def start(self, path: Path, why: str = "") -> None:
        """Load `path`, then switch to it; `why` is told first (a conversation's own model, say)."""
        if self._cancel is not None:
            self._cancel.set()
            if self._waiting:  # an earlier choice, loaded and waiting for an answer's end: not wanted now
                earlier = self._cancel
                self._widgets.log.run_worker(
                    lambda: self._service.slot.drop_prepared(earlier), thread=True, exit_on_error=False
                )
        cancel = self._cancel = threading.Event()
        self._target, self._waiting = path, False
        self._share = 0.0
        self._started = time.monotonic()
        if self._timer is None:
            self._timer = self._widgets.log.set_interval(PROGRESS_EVERY_S, self._show_progress)
        self._status.state = f"loading {path.name}…"
        if why:
            self._widgets.log.notify(why, title="Model", timeout=8)
        self._widgets.log.run_worker(
            lambda: self._load(path, cancel), thread=True, group="model-switch", exit_on_error=False
        )

    def follow_conversation(self) -> None:
        """A conversation answered by another model that is still here gets that model back."""
        try:
            remembered = self._service.remembered_model()
        except ChatappError:
            return
        if remembered is None or self.loading:
            return
        current = self._service.slot.model_label()
        if problem := file_fit_problem(remembered):
            self._widgets.log.notify(
                f"This conversation was with {remembered.name}, which {problem}: staying with {current}.",
                title="Model",
                severity="warning",
                timeout=10,
            )
            return
        self.start(remembered, f"This conversation was with {remembered.name}: loading it (Esc stays with {current}).")

    def cancel(self) -> bool:
        """Esc: stop loading (or drop a model loaded and waiting); False when nothing was loading."""
        if self._cancel is None or self._cancel.is_set():
            return False
        self._cancel.set()
        self._end(f"stayed with {self._service.slot.model_label()}")
        if self._waiting:
            self._waiting = False
            cancel = self._cancel
            self._widgets.log.run_worker(
                lambda: self._service.slot.drop_prepared(cancel), thread=True, exit_on_error=False
            )
        return True

    def stop(self) -> None:
        """The app closes: a load in progress stops at its next progress report."""
        if self._cancel is not None:
            self._cancel.set()

    def answer_ended(self) -> None:
        """The answer in flight ended: a model waiting for it takes over now."""
        if self._waiting and not self._answering():
            self._switch()

    # Off the UI thread.
    def _load(self, path: Path, cancel: threading.Event) -> None:
        def progress(share: float) -> bool:
            self._share = share  # read by the timer: the load never waits for the screen
            return not cancel.is_set()

        try:
            self._service.slot.prepare(path, progress, cancel)
        except LoadCancelled:
            return  # told already, when Esc was pressed
        except ChatappError as error:
            self._widgets.log.app.call_from_thread(self._failed, str(error), cancel)
            return
        except Exception as error:  # never a worker that dies with the progress row still shown
            self._widgets.log.app.call_from_thread(self._failed, f"loading {path.name} failed: {error}", cancel)
            return
        if cancel.is_set():
            self._service.slot.drop_prepared(cancel)
            return
        if self._widgets.log.app.call_from_thread(self._loaded, cancel):
            self._swap(cancel)  # no answer runs: switch in this worker, without another hop

    def _swap(self, cancel: threading.Event) -> None:
        try:
            label = self._service.switch_to_prepared(cancel)
        except ChatappError as error:
            self._widgets.log.app.call_from_thread(self._failed, str(error), cancel)
            return
        self._widgets.log.app.call_from_thread(self._switched, label, cancel)
        self._service.slot.close_retired()  # the old model's cache written while the new one answers

    # On the UI thread.
    def _show_progress(self) -> None:
        if time.monotonic() - self._started < PROGRESS_AFTER_S:
            return
        if self.loading and not self._waiting and self._target is not None:
            self._row.show_share(f"loading {self._target.name}", self._share)

    def _loaded(self, cancel: threading.Event) -> bool:
        """Whether to switch now (no answer runs); else the switch waits for the answer's end."""
        if cancel is not self._cancel or cancel.is_set():
            return False
        if self._answering():
            self._waiting = True
            name = self._target.name if self._target else "the new model"
            self._status.state = f"{name} is ready: switching after this answer"
            return False
        self._status.state = "switching models…"
        return True

    def _switch(self) -> None:
        cancel = self._cancel
        if cancel is None:
            return
        self._waiting = False
        self._status.state = "switching models…"
        self._widgets.log.run_worker(lambda: self._swap(cancel), thread=True, group="model-switch", exit_on_error=False)

    def _switched(self, label: str, cancel: threading.Event) -> None:
        if cancel is self._cancel:  # a newer choice may be loading: its progress stays shown
            self._cancel = None
            self._end("ready")
        self._ready(label)
        self._widgets.log.notify(f"Now answering with {label}.", title="Model", timeout=6)

    def _failed(self, reason: str, cancel: threading.Event) -> None:
        if cancel is self._cancel:
            self._cancel = None
            self._end("ready")
        self._widgets.log.notify(reason, title="Cannot switch models", severity="error", timeout=15)

    def _end(self, state: str) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self._row.hide()
        self._status.state = state

    @property
    def _row(self) -> PrefillRow:
        return self._widgets.prefill

    @property
    def _status(self) -> StatusLine:
        return self._widgets.status
