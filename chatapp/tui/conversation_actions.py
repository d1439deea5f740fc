"""What the user does to whole conversations from the chat screen: new, rename, delete, export,
Q&A mode, and the persona of a new branch. Each asks the service and redraws through the
screen's `BranchDisplay`; dialogs ask first where something would be lost."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from chatapp.errors import ChatappError
from chatapp.paths import user_path
from chatapp.records import PersonaRecord
from chatapp.services.branches import BranchView
from chatapp.services.chat_service import ChatService
from chatapp.services.export import export_file_name, export_view
from chatapp.tui.attempt import attempt
from chatapp.tui.branch_display import BranchDisplay
from chatapp.tui.chat_widgets import ChatWidgets
from chatapp.tui.dialogs import Confirm, TextPrompt


class ConversationActions:
    def __init__(
        self,
        widgets: ChatWidgets,
        service: ChatService,
        shown: BranchDisplay,
        refuse_while_busy: Callable[[], bool],
        titled: Callable[[str], None],
    ) -> None:
        """`refuse_while_busy`: True (and the user told why) while an answer runs or a document is read;
        `titled`: the screen's title is now this."""
        self._widgets = widgets
        self._service = service
        self._shown = shown
        self._refuse_while_busy = refuse_while_busy
        self._titled = titled

    async def run(self, command: str) -> None:
        """A key's command: new, rename, delete, export or qa (Q&A mode on or off)."""
        if command == "new":
            await self.new()
        elif command == "rename":
            self.rename()
        elif command == "delete":
            if self._shown.branch is not None:
                self.delete(self._shown.branch.conversation.id)
        elif command == "export":
            self.export()
        elif command == "qa":
            await self.toggle_qa_mode()

    async def new(self) -> None:
        if self._refuse_while_busy():
            return
        persona = self._current_persona()
        await self._shown.change(lambda: self._service.current.new_conversation(persona))
        self._widgets.composer.focus()

    def _current_persona(self) -> PersonaRecord | None:
        branch = self._shown.branch
        name = branch.persona_name if branch is not None else None
        if not name:
            return None
        return attempt(self._widgets.log, lambda: self._service.personas.named(name))

    async def use_persona(self, persona: PersonaRecord | None) -> None:
        if self._refuse_while_busy():
            return
        await self._shown.change(lambda: self._service.set_persona(persona))
        self._widgets.log.notify(f"Persona: {persona.name if persona else 'none'} (a new branch from the start).")

    def rename(self) -> None:
        shown = self._shown
        if shown.branch is None:
            return

        def renamed(title: str | None) -> None:
            if title is None:
                return
            try:
                self._service.current.rename(title)
                shown.branch = self._service.current.view()
            except ChatappError as error:
                self._widgets.log.notify(str(error), severity="error", timeout=10)
                return
            self._titled(shown.branch.conversation.title)
            shown.refresh_conversations()

        self._widgets.log.app.push_screen(TextPrompt("Rename conversation", shown.branch.conversation.title), renamed)

    def delete(self, conversation_id: int) -> None:
        """Delete a conversation and its branches once the user said yes; the open one gives way to another."""
        if self._refuse_while_busy():
            return
        current = self._service.current
        shown = self._shown

        def delete_and_open_another() -> BranchView:
            current.delete(conversation_id)
            return current.open_latest_or_new()

        async def decided(yes: bool | None) -> None:
            if not yes:
                return
            if shown.branch is not None and shown.branch.conversation.id == conversation_id:
                await shown.change(delete_and_open_another)
            else:
                attempt(self._widgets.log, lambda: current.delete(conversation_id))
                shown.refresh_conversations()

        listed = attempt(self._widgets.log, current.list_conversations) or []
        title = next((c.title for c in listed if c.id == conversation_id), "this conversation")
        self._widgets.log.app.push_screen(Confirm(f"Delete “{title}” and all its branches?"), decided)

    def export(self) -> None:
        if self._shown.branch is None:
            return
        current = self._service.current
        default = str(Path.home() / f"{export_file_name(current.view())}.md")

        def chosen(path: str | None) -> None:
            if not path:
                return
            try:
                written = export_view(current.view(), user_path(path))
            except ChatappError as error:
                self._widgets.log.notify(str(error), severity="error", timeout=10)
                return
            self._widgets.log.notify(f"Branch exported to {written}")

        self._widgets.log.app.push_screen(TextPrompt("Export this branch to (.md or .json)", default), chosen)

    async def toggle_qa_mode(self) -> None:
        branch = self._shown.branch
        if branch is None or self._refuse_while_busy():
            return
        on = not branch.conversation.qa_mode

        def toggle() -> BranchView:
            self._service.current.set_qa_mode(on)
            return self._service.current.view()

        await self._shown.change(toggle)
        self._widgets.log.notify(
            "Q&A mode on: each question starts from the persona and document." if on else "Q&A mode off."
        )
