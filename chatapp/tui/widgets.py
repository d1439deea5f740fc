"""Widgets of the main screen: one message, the status line, the prefill progress row."""

from __future__ import annotations

import re

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Markdown, ProgressBar, Static

ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "Persona"}
CODE_BLOCK = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def last_code_block(markdown: str) -> str | None:
    """The text of the last fenced code block (an unclosed one counts: the answer may be cut)."""
    blocks = CODE_BLOCK.findall(markdown)
    return blocks[-1].rstrip("\n") if blocks else None


class MessageView(Vertical):
    """A message: who wrote it and which version it is ("2/3"), its Markdown body, and a footnote."""

    def __init__(self, role: str, text: str = "", *, message_id: int | None = None, position: int = 1, siblings: int = 1) -> None:
        super().__init__(classes=f"message {role}")
        self.role = role
        self.message_id = message_id
        self.position, self.version_count = position, siblings
        self._initial_text = text

    def compose(self) -> ComposeResult:
        with Horizontal(classes="message-head"):
            yield Label(ROLE_TITLES.get(self.role, self.role), classes="role")
            yield Label(self._version_text(), classes="versions")
        yield Markdown(self._initial_text, classes="body")
        yield Label("", classes="footnote")

    def _version_text(self) -> str:
        return f"‹ {self.position}/{self.version_count} ›" if self.version_count > 1 else ""

    @property
    def body(self) -> Markdown:
        return self.query_one(".body", Markdown)

    @property
    def text(self) -> str:
        bodies = self.query(".body")
        return bodies.first(Markdown).source if bodies else self._initial_text

    def set_footnote(self, text: str) -> None:
        self.query_one(".footnote", Label).update(text)


class StatusLine(Static):
    """One line at the bottom: model, persona, context use, speed, cache result, and what is happening."""

    def show(self, *fields: str) -> None:
        self.update("  ·  ".join(field for field in fields if field))


class PrefillRow(Horizontal):
    """Progress of a long prefill (tokens done / total); Esc cancels it."""

    def compose(self) -> ComposeResult:
        yield Label("", id="prefill-label")
        yield ProgressBar(total=100, show_eta=False, id="prefill-bar")

    def show_progress(self, what: str, done: int, total: int) -> None:
        self.display = True
        self.query_one("#prefill-label", Label).update(f"{what} {done:,}/{total:,} tokens · Esc cancels ")
        self.query_one("#prefill-bar", ProgressBar).update(total=total, progress=done)

    def hide(self) -> None:
        self.display = False
