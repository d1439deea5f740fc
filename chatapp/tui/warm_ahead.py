"""Warming up while the user types: the settled part of the draft is computed before Enter.

A warm-up runs in a worker thread; its progress comes back as `WarmProgress` messages and shows
in the progress row while it is long. An answer sent meanwhile waits for it, so the row keeps
showing it then.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.worker import get_current_worker

from chatapp.prompting.planner import settled_text
from chatapp.services.chat_service import ChatService
from chatapp.services.streams import PromptProgress
from chatapp.tui.chat_widgets import ChatWidgets
from chatapp.tui.messages import WarmProgress
from chatapp.tui.widgets import PROGRESS_FROM_TOKENS


class WarmAhead:
    """Warms the prompt of the draft whenever its settled text changes."""

    def __init__(
        self, widgets: ChatWidgets, service: ChatService, may_warm: Callable[[], bool], streaming: Callable[[], bool]
    ) -> None:
        """`may_warm`: no answer runs and no question is edited; `streaming`: answer text is arriving."""
        self._widgets = widgets
        self._service = service
        self._may_warm = may_warm
        self._streaming = streaming
        self._settled = ""

    def typed(self, draft: str) -> None:
        """The box changed: warm again only when its settled text did."""
        settled = settled_text(draft)
        if settled != self._settled:
            self._settled = settled
            self.ahead(draft)

    def ahead(self, draft: str) -> None:
        if self._service.slot.ready and self._may_warm():
            self._settled = settled_text(draft)
            self._widgets.log.run_worker(lambda: self._run(draft), thread=True, exclusive=True, group="warm")

    def _run(self, draft: str) -> None:
        """Worker thread: queue the warm-up and report its progress while it is long."""
        worker = get_current_worker()
        try:
            warm_up = self._service.warm_ahead(draft)
            if warm_up is None:
                return
            for event in warm_up.events():
                if worker.is_cancelled:
                    return
                if isinstance(event, PromptProgress) and event.total >= PROGRESS_FROM_TOKENS:
                    self._widgets.post(WarmProgress(event.done, event.total))
        except Exception:  # warming is an optimisation: the answer itself will say what is wrong
            return
        finally:
            self._widgets.post(WarmProgress(-1, -1))

    def progress(self, message: WarmProgress, answering: bool) -> None:
        """Show a long warm-up; an answer sent meanwhile waits for it, so keep showing it then."""
        row = self._widgets.prefill
        if message.done < 0 or message.done >= message.total:
            if not answering:
                row.hide()
        elif not self._streaming():
            row.show_progress("reading the prompt" if answering else "warming up", message.done, message.total)
