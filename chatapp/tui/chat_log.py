"""The message view: the open branch's messages, one selected, new answers streamed in."""

from __future__ import annotations

from textual.containers import VerticalScroll

from chatapp.services.branches import BranchView
from chatapp.tui.format import answer_footnote
from chatapp.tui.widgets import MessageView
from chatapp.vocabulary import Role


class ChatLog(VerticalScroll):
    """Shows a branch. Alt+Up/Down move the selection; actions apply to the selected message
    (the last one when nothing is selected)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.selected_index: int | None = None

    @property
    def views(self) -> list[MessageView]:
        return list(self.query_children(MessageView))

    async def show_branch(self, view: BranchView) -> None:
        """Render every message of the branch (after a switch of conversation or branch)."""
        await self.remove_children()
        widgets = []
        for message in view.messages:
            record = message.record
            widget = MessageView(
                record.role, message.shown, message_id=record.id, position=message.position, siblings=message.siblings
            )
            widgets.append(widget)
        if widgets:
            await self.mount_all(widgets)
        for widget, message in zip(widgets, view.messages, strict=True):
            widget.set_footnote(answer_footnote(message.record))
        self.selected_index = None
        self._mark_selection()
        self.scroll_end(animate=False)

    async def refresh_versions(self, view: BranchView) -> bool:
        """Update ids, "2/3" labels and texts in place after an answer; False if the views no longer match."""
        widgets = self.views
        if len(widgets) != len(view.messages) or any(
            w.role != m.record.role for w, m in zip(widgets, view.messages, strict=True)
        ):
            return False
        for widget, message in zip(widgets, view.messages, strict=True):
            if widget.text != message.shown:  # the saved text is the truth
                await widget.body.update(message.shown)
            widget.message_id = message.record.id
            widget.position, widget.version_count = message.position, message.siblings
            widget.show_versions()
            widget.set_footnote(answer_footnote(message.record))
        return True

    async def cut_after(self, index: int) -> None:
        """Remove the messages after position `index` (-1 removes all): a new branch replaces them."""
        for widget in self.views[index + 1 :]:
            await widget.remove()
        self.selected_index = None
        self._mark_selection()

    async def add(self, role: Role, text: str = "") -> MessageView:
        widget = MessageView(role, text)
        await self.mount(widget)
        self.scroll_end(animate=False)
        return widget

    # Selection.
    @property
    def selected(self) -> MessageView | None:
        widgets = self.views
        if not widgets:
            return None
        index = self.selected_index if self.selected_index is not None else len(widgets) - 1
        return widgets[min(index, len(widgets) - 1)]

    def move_selection(self, step: int) -> MessageView | None:
        widgets = self.views
        if not widgets:
            return None
        current = self.selected_index if self.selected_index is not None else len(widgets) - 1
        self.selected_index = max(0, min(len(widgets) - 1, current + step))
        self._mark_selection()
        selected = self.selected
        if selected is not None:
            self.scroll_to_widget(selected, animate=False)
        return selected

    def index_of(self, widget: MessageView) -> int:
        return self.views.index(widget)

    def _mark_selection(self) -> None:
        selected = self.selected if self.selected_index is not None else None
        for widget in self.views:
            widget.set_class(widget is selected, "selected")
