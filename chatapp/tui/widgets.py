"""Widgets of the main screen: one message, the status line, the prefill progress row."""

from __future__ import annotations

import re
from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Label, Markdown, ProgressBar

from chatapp.tui.format import speed_fields
from chatapp.vocabulary import Role

ROLE_TITLES = {Role.USER: "You", Role.ASSISTANT: "Assistant", Role.SYSTEM: "Persona"}
CODE_BLOCK = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def last_code_block(markdown: str) -> str | None:
    """The text of the last fenced code block (an unclosed one counts: the answer may be cut)."""
    blocks = CODE_BLOCK.findall(markdown)
    return blocks[-1].rstrip("\n") if blocks else None


class MessageView(Vertical):
    """A message: who wrote it and which version it is ("2/3"), its Markdown body, and a footnote."""

    def __init__(
        self, role: Role, text: str = "", *, message_id: int | None = None, position: int = 1, siblings: int = 1
    ) -> None:
        super().__init__(classes=f"message {role.value}")
        self.role = role
        self.message_id = message_id
        self.position, self.version_count = position, siblings
        self._initial_text = text

    def compose(self) -> ComposeResult:
        with Horizontal(classes="message-head"):
            yield Label(ROLE_TITLES[self.role], classes="role")
            yield Label(self._version_text(), classes="versions")
        yield Markdown(self._initial_text, classes="body")
        yield Label("", classes="footnote")

    def show_versions(self) -> None:
        """Update "‹ 2/3 ›" after `position` or `version_count` changed."""
        self.query_one(".versions", Label).update(self._version_text())

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


class StatusLine(Widget):
    """One line at the bottom: what is happening, context use, speed, cache result, persona, model.

    What changes comes first, so a narrow terminal cuts the model's name (also under each answer)
    and the persona (also above the chat) rather than the context use. Each part is a reactive
    attribute: the screen sets what changed and Textual redraws the line.
    """

    state: reactive[str] = reactive("loading model…")
    model: reactive[str] = reactive("loading model…")
    persona: reactive[str] = reactive("")
    context_used: reactive[int] = reactive(0)
    context_size: reactive[int | None] = reactive(None)
    last_answer: reactive[dict[str, Any] | None] = reactive(None)  # the figures of the last answer

    def render(self) -> str:
        fields = [self.state]
        if self.context_size is not None:
            fields.append(f"context {self.context_used:,}/{self.context_size:,}")
        if self.last_answer:
            fields.extend(speed_fields(self.last_answer))
        fields += [self.persona, self.model]
        return "  ·  ".join(field for field in fields if field)


PROGRESS_FROM_TOKENS = 256  # shorter prefills finish before a progress bar would help


class PrefillRow(Horizontal):
    """Progress of a long prefill (tokens done / total); Esc cancels it."""

    def compose(self) -> ComposeResult:
        yield Label("", id="prefill-label")
        yield ProgressBar(total=100, show_eta=False, id="prefill-bar")

    def show_progress(self, what: str, done: int, total: int) -> None:
        self.display = True
        self.query_one("#prefill-label", Label).update(f"{what} {done:,}/{total:,} tokens · Esc cancels ")
        self.query_one("#prefill-bar", ProgressBar).update(total=total, progress=done)

    def show_share(self, what: str, share: float) -> None:
        """Progress of work measured as a share (loading a model's weights)."""
        self.display = True
        self.query_one("#prefill-label", Label).update(f"{what} {share:.0%} · Esc cancels ")
        self.query_one("#prefill-bar", ProgressBar).update(total=100, progress=int(share * 100))

    def hide(self) -> None:
        self.display = False
