"""The branch on the chat screen: its messages, the line above them, the tree and the conversation list.

Every change of what is shown (open, jump, new, persona, document) goes through `change`, which
asks the service for the new view and redraws; a service error becomes a notification and the
screen keeps what it showed.
"""

from __future__ import annotations

from collections.abc import Callable

from chatapp.errors import ChatappError
from chatapp.services.branches import BranchView
from chatapp.services.chat_service import ChatService
from chatapp.tui.attempt import attempt
from chatapp.tui.chat_widgets import ChatWidgets


class BranchDisplay:
    """What the screen shows of the open conversation; `branch` is None until one is open."""

    def __init__(
        self,
        widgets: ChatWidgets,
        service: ChatService,
        leaving: Callable[[], None],
        arrived: Callable[[], None],
        titled: Callable[[str], None],
    ) -> None:
        """`leaving`: what a new view ends on the screen (an edit, the progress row); `arrived`: what
        follows it being shown (warming up its prompt); `titled`: the screen's title is now this."""
        self._widgets = widgets
        self._titled = titled
        self._service = service
        self._leaving = leaving
        self._arrived = arrived
        self.branch: BranchView | None = None

    async def change(self, change: Callable[[], BranchView]) -> bool:
        """Show the view `change` returns; False (and a notification) when the service refused."""
        try:
            self.branch = change()
        except ChatappError as error:
            self._widgets.log.notify(str(error), severity="error")
            return False
        self._leaving()
        await self.show()
        self.refresh_conversations()
        self._arrived()
        return True

    async def show(self) -> None:
        assert self.branch is not None
        await self._widgets.log.show_branch(self.branch)
        self.after_change()

    async def reload(self) -> None:
        """An answer ended: show the branch as saved (only the newest versions redrawn where possible)."""
        try:
            self.branch = self._service.current.view()
        except ChatappError as error:
            self._widgets.log.notify(str(error), severity="error")
            return
        if not await self._widgets.log.refresh_versions(self.branch):
            await self.show()
        else:
            self.after_change()
        self.refresh_conversations()

    def after_change(self) -> None:
        """The tree, the line above the messages, the status line and the title for the branch shown."""
        assert self.branch is not None
        self.update_info()
        active = {m.record.id for m in self.branch.messages} | {self.branch.root.id}
        current = self._service.current
        try:
            self._widgets.sidebar.branch_tree.show(current.tree(), active, current.document_names())
        except ChatappError as error:
            self._widgets.log.notify(str(error), severity="error")
        figures = next((m.record.stats for m in reversed(self.branch.messages) if m.record.stats), None)
        used = int(figures.get("prompt_tokens", 0) + figures.get("generated_tokens", 0)) if figures else 0
        status = self._widgets.status
        status.context_used = used
        status.persona = self.branch.persona_name or "no persona"
        self._titled(self.branch.conversation.title)

    def update_info(self) -> None:
        """The line above the messages: persona, document (and its share of the context), Q&A mode."""
        if self.branch is None:
            return
        branch = self.branch
        fields = [f"Persona: {branch.persona_name or 'none'}"]
        document = branch.document
        if document is not None:
            tokens = attempt(self._widgets.log, lambda: self._service.document_tokens(document))
            size = self._service.slot.context_size()
            amount = f" ({tokens:,} of {size:,} tokens)" if tokens is not None and size else ""
            fields.append(f"Document: {document.name}{amount}")
        if branch.conversation.qa_mode:
            fields.append("Q&A mode: each question starts from the document")
        self._widgets.info.update("  ·  ".join(fields))

    def refresh_conversations(self, query: str | None = None) -> None:
        search = self._widgets.sidebar.search.value if query is None else query
        current = self.branch.conversation.id if self.branch else None
        conversations = attempt(self._widgets.log, lambda: self._service.current.list_conversations(search))
        if conversations is not None:
            self._widgets.sidebar.conversations.show(conversations, current)

    def show_as_the_model_reads(self, answering: bool) -> None:
        """Shown before the model loaded, a gpt-oss answer was its raw text: now its reply (see ChatService.view)."""
        if self.branch is None or answering or not self._service.slot.hides_reasoning():
            return  # nothing shown raw (an answer in flight: its end refreshes the view)
        try:
            view = self._service.current.view()
        except ChatappError:
            return
        if any(message.shown != old.shown for message, old in zip(view.messages, self.branch.messages, strict=False)):
            self.branch = view
            self._widgets.log.call_later(self._widgets.log.refresh_versions, view)
