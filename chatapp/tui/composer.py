"""The message box: multi-line; Enter sends, Ctrl+J (or Alt+Enter) starts a new line."""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import TextArea

NEWLINE_KEYS = {"ctrl+j", "alt+enter", "shift+enter"}


class Composer(TextArea):
    """A TextArea whose Enter hands the text over and empties the box at once,
    so whatever is typed next is kept for the next message."""

    @dataclass
    class Submitted(Message):
        composer: Composer
        text: str

    @dataclass
    class EditLast(Message):
        """Up was pressed in an empty box: the user wants to edit the last question."""

    def __init__(self, *, id: str | None = None, placeholder: str = "") -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", id=id, placeholder=placeholder)

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            text = self.text
            if text.strip():
                self.clear()
            self.post_message(self.Submitted(self, text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        if event.key == "up" and not self.text:
            event.stop()
            event.prevent_default()
            self.post_message(self.EditLast())
            return
        await super()._on_key(event)

    def give_back(self, text: str) -> None:
        """Put unsent text back in the box; what the user typed meanwhile is kept after it."""
        if not text:
            return
        if self.text.strip() and self.text != text:
            self.text = text + "\n\n" + self.text
            self.notify("Your unsent message is back in the box, above what you typed since.")
        else:
            self.text = text
