"""Editing a question from the chat screen: the box takes the question, Enter sends it as a new branch.

What the box held before the edit is set aside and comes back once the edit is sent (or cancelled).
"""

from __future__ import annotations

from collections.abc import Callable

from chatapp.tui.chat_widgets import ChatWidgets
from chatapp.tui.widgets import MessageView
from chatapp.vocabulary import Role


class QuestionEdit:
    """At most one question edited at a time; `editing` is its message id."""

    def __init__(self, widgets: ChatWidgets, model_ready: Callable[[], bool]) -> None:
        self._widgets = widgets
        self._model_ready = model_ready  # whether the status line may go back to "ready"
        self.editing: int | None = None
        self.set_aside = ""  # the box's text before the edit began

    def selected_question(self) -> MessageView | None:
        """The selected question, or the question of the selected answer."""
        log = self._widgets.log
        selected = log.selected
        if selected is not None and selected.role is Role.ASSISTANT:
            index = log.index_of(selected)
            selected = log.views[index - 1] if index > 0 else None
        return selected if selected is not None and selected.message_id is not None else None

    def last_question(self) -> MessageView | None:
        views = self._widgets.log.views
        return next((w for w in reversed(views) if w.role is Role.USER and w.message_id is not None), None)

    def begin(self, question: MessageView) -> None:
        composer = self._widgets.composer
        if self.editing is None:
            self.set_aside = composer.text  # put back when the edit is sent or cancelled
        composer.text = question.text
        composer.move_cursor(composer.document.end)
        composer.focus()
        self.editing = question.message_id
        self._widgets.status.state = "editing a question: Enter sends it as a new branch, Esc cancels"

    def cancel(self) -> None:
        self.editing = None
        self._widgets.composer.text = self.set_aside
        self.set_aside = ""
        if self._model_ready():
            self._widgets.status.state = "ready"

    def take(self) -> tuple[int | None, str]:
        """Sending: the question edited (None for a new one) and what the box held before the edit."""
        edited, set_aside = self.editing, ""
        if edited is not None:
            set_aside, self.set_aside = self.set_aside, ""
        self.editing = None
        return edited, set_aside

    def resume(self, edited: int, set_aside: str) -> None:
        """The edit was never sent: it stays an edit when sent again."""
        self.editing = edited
        self.set_aside = set_aside
