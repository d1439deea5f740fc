"""Attaching a document from the chat screen: read and measured off the UI thread, then a branch about it.

Sending waits while a document is read (its branch opens first). The Textual layer only drives the
service here: reading, measuring and the new root are the service's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from chatapp.errors import ChatappError
from chatapp.services.branches import BranchView
from chatapp.services.chat_service import ChatService, PreparedDocument
from chatapp.services.document_files import start_folder
from chatapp.tui.chat_widgets import ChatWidgets
from chatapp.tui.document_picker import DocumentPicker


class DocumentAttach:
    """One document read at a time (a newer one replaces the read in progress)."""

    def __init__(
        self,
        widgets: ChatWidgets,
        service: ChatService,
        change_view: Callable[[Callable[[], BranchView]], Awaitable[object]],
        branch: Callable[[], BranchView | None],
    ) -> None:
        """`change_view`: the screen's way to open a branch (and say why it could not); `branch`: the one on
        screen."""
        self._widgets = widgets
        self._service = service
        self._change_view = change_view
        self._branch = branch
        self.reading = False  # a document is being read and attached: sending waits

    def choose(self) -> None:
        """Ask which document (the picker starts where the last one was), then attach it."""

        def chosen(path: Path | None) -> None:
            if path is not None:
                self.attach(path)

        self._widgets.log.app.push_screen(DocumentPicker(start_folder(self._service)), chosen)

    def attach(self, path: Path) -> None:
        """Read the document off the UI thread; sending waits until it is attached."""
        self.reading = True
        self._widgets.status.state = f"reading {path.name}…"
        self._widgets.log.run_worker(lambda: self._read(path), thread=True, exclusive=True, group="document")

    def _read(self, path: Path) -> None:
        app = self._widgets.log.app
        try:
            prepared = self._service.prepare_document(path)
        except ChatappError as error:
            app.call_from_thread(self._failed, str(error))
            return
        except Exception as error:  # a PDF library failing must not take the screen down
            app.call_from_thread(self._failed, f"cannot read {path.name}: {error}")
            return
        app.call_from_thread(lambda: self._widgets.log.call_later(self._attach_read, prepared))

    def _failed(self, reason: str) -> None:
        self.reading = False
        self._widgets.status.state = "ready"
        self._widgets.log.notify(reason, severity="error", timeout=12)

    async def _attach_read(self, prepared: PreparedDocument) -> None:
        self._widgets.status.state = "ready"
        await self._change_view(lambda: self._service.attach_prepared(prepared))
        self.reading = False  # only now: sending waits until the branch with the document is open
        branch = self._branch()
        if branch is not None and branch.document is not None:
            size = f": {prepared.tokens:,} tokens with the persona" if prepared.tokens is not None else ""
            self._widgets.log.notify(f"{prepared.document.name} attached{size}.")
