"""Widgets of the chat screen: one message, and the status line."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Input, Label, Markdown, Static

ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "Persona"}


class MessageView(Vertical):
    """A message: who wrote it, its Markdown body, and a footnote (statistics, 'stopped')."""

    DEFAULT_CLASSES = "message"

    def __init__(self, role: str, text: str = "") -> None:
        super().__init__(classes=f"message {role}")
        self.role = role
        self._initial_text = text

    def compose(self) -> ComposeResult:
        yield Label(ROLE_TITLES.get(self.role, self.role), classes="role")
        yield Markdown(self._initial_text, classes="body")
        yield Label("", classes="footnote")

    @property
    def body(self) -> Markdown:
        return self.query_one(".body", Markdown)

    def set_footnote(self, text: str) -> None:
        self.query_one(".footnote", Label).update(text)


class StatusLine(Static):
    """One line at the bottom: model, context use, speed, and what is happening."""

    DEFAULT_CLASSES = "status"

    def show(self, *fields: str) -> None:
        self.update("  ·  ".join(field for field in fields if field))


class PromptInput(Input):
    """The message line. Enter hands the text over and empties the line at once, so
    whatever the user types next is kept for the next message."""

    async def action_submit(self) -> None:
        text = self.value
        if text.strip():
            self.value = ""
        self.post_message(self.Submitted(self, text, None))
