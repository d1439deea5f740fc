"""The document picker: a file browser of what can be attached, and a path field that completes names.

Enter on a file in the tree, or on a typed path, returns the file; Esc returns None. A
typed path that cannot be attached gets one line under the field saying why, and the
dialog stays open. Which files qualify, where it starts and how a path completes are the
services' (`chatapp.services.document_files`); this module only shows them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.suggester import Suggester
from textual.widgets import DirectoryTree, Input, Label

from chatapp.errors import ChatappError
from chatapp.services.document_files import (
    SUPPORTED,
    check_document_path,
    complete_path,
    document_path,
    is_shown,
    typed_folder,
)


class DocumentTree(DirectoryTree):
    """Folders and attachable files; hidden ones left out."""

    def filter_paths(self, paths: Iterable[Path]) -> Iterable[Path]:
        return [path for path in paths if is_shown(path)]


class PathSuggester(Suggester):
    """Suggests the typed path with its last part completed (relative paths start at `base`)."""

    def __init__(self, base: Path) -> None:
        super().__init__(use_cache=False, case_sensitive=True)  # folders change; paths keep their case
        self.base = base

    async def get_suggestion(self, value: str) -> str | None:
        return await asyncio.to_thread(complete_path, value, self.base)


class PathInput(Input):
    """An Input where Tab accepts the completion (as Right does) and moves on when there is none."""

    BINDINGS = [
        Binding("tab", "complete", "Complete", show=False),
        Binding("down", "app.focus_next", "Browse", show=False),
    ]

    def action_complete(self) -> None:
        if self._suggestion and self.cursor_at_end:
            self.action_cursor_right()
        else:
            self.screen.focus_next()


class DocumentPicker(ModalScreen[Path | None]):
    """Returns the chosen file (`~` expanded), or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="dialog.cancel")]

    def __init__(self, folder: Path) -> None:
        super().__init__(classes="dialog-screen")
        self.folder = folder

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="document-picker"):
            yield Label("Attach a document", classes="dialog-title")
            yield PathInput(
                os.path.join(self.folder, ""),  # the folder with its trailing separator, ready for a name
                placeholder=f"path to a {SUPPORTED} file",
                suggester=PathSuggester(self.folder),
                id="document-path",
            )
            yield Label("", id="document-problem")
            yield DocumentTree(self.folder, id="document-tree")
            yield Label(
                "Enter attaches the file typed or chosen  ·  Tab or → completes a name  ·  ↓ browses  ·  Esc cancels\n"
                "Its text goes after the persona; every question reuses its KV.",
                classes="dialog-hint",
            )

    def on_mount(self) -> None:
        field = self.query_one(PathInput)
        field.focus()
        field.cursor_position = len(field.value)

    @on(Input.Changed, "#document-path")
    def typed(self, event: Input.Changed) -> None:
        self.query_one("#document-problem", Label).update("")
        if event.value.endswith("/"):  # a folder typed or completed: browse it
            folder = typed_folder(event.value, self.folder)
            tree = self.query_one(DocumentTree)
            if folder is not None and folder != tree.path:
                tree.path = folder

    @on(Input.Submitted, "#document-path")
    def submitted(self, event: Input.Submitted) -> None:
        self._attach_file(lambda: document_path(event.value, self.folder))

    @on(DirectoryTree.FileSelected, "#document-tree")
    def chosen(self, event: DirectoryTree.FileSelected) -> None:
        event.stop()
        self._attach_file(lambda: check_document_path(event.path))  # a real path: never read as typed text

    def _attach_file(self, checked: Callable[[], Path]) -> None:
        """Return the file `checked` gives, or say under the field why it cannot be attached."""
        try:
            path = checked()
        except ChatappError as error:
            self.query_one("#document-problem", Label).update(str(error))
            return
        self.dismiss(path)

    def action_cancel(self) -> None:
        self.dismiss(None)
