"""Personas: pick one for the conversation, or create, edit, duplicate, delete, import, export."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, TextArea
from textual.widgets.option_list import Option

from chatapp.errors import ChatappError
from chatapp.paths import user_path
from chatapp.records import PersonaRecord
from chatapp.services.personas import PersonaService
from chatapp.tui.attempt import attempt
from chatapp.tui.dialogs import Confirm, TextPrompt

NO_PERSONA = "none"
T = TypeVar("T")


class PersonaScreen(ModalScreen["PersonaScreen.Choice | None"]):
    """Enter (or Use) applies the highlighted persona to the open conversation as a new branch."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="personas.close"),
        Binding("ctrl+s", "save", "Save", id="personas.save", priority=True),
        Binding("ctrl+u", "use", "Use", id="personas.use", priority=True),
    ]

    @dataclass(frozen=True)
    class Choice:
        persona: PersonaRecord | None

    def __init__(self, personas: PersonaService, current_name: str | None) -> None:
        super().__init__(classes="dialog-screen")
        self.personas = personas
        self.current_name = current_name
        self.editing: PersonaRecord | None = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label(
                "Personas  ·  Enter or Ctrl+U uses the highlighted one  ·  Ctrl+S saves  ·  Esc closes",
                classes="dialog-title",
            )
            with Horizontal(id="persona-body"):
                yield OptionList(id="persona-list")
                with Vertical(id="persona-editor"):
                    yield Input(placeholder="Name", id="persona-name")
                    yield TextArea(id="persona-prompt", soft_wrap=True)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Use", variant="primary", id="use")
                yield Button("Save", id="save")
                yield Button("New", id="new")
                yield Button("Duplicate", id="duplicate")
                yield Button("Delete", variant="error", id="delete")
                yield Button("Import…", id="import")
                yield Button("Export…", id="export")

    def on_mount(self) -> None:
        self.reload(select_name=self.current_name)
        self.query_one("#persona-list").focus()

    def reload(self, select_name: str | None = None, select_id: int | None = None) -> None:
        options = self.query_one("#persona-list", OptionList)
        options.clear_options()
        options.add_option(Option("(no persona)", id=NO_PERSONA))
        records = attempt(self, self.personas.all) or []
        for record in records:
            options.add_option(Option(record.name, id=str(record.id)))
        chosen = next((r for r in records if r.id == select_id or (select_id is None and r.name == select_name)), None)
        options.highlighted = options.get_option_index(str(chosen.id)) if chosen else 0
        self._edit(chosen)

    def _edit(self, record: PersonaRecord | None) -> None:
        self.editing = record
        self.query_one("#persona-name", Input).value = record.name if record else ""
        self.query_one("#persona-prompt", TextArea).text = record.prompt if record else ""

    @on(OptionList.OptionHighlighted, "#persona-list")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        option_id = event.option.id
        self._edit(None if option_id == NO_PERSONA else attempt(self, lambda: self.personas.get(int(option_id or 0))))

    @on(OptionList.OptionSelected, "#persona-list")
    def _selected(self) -> None:
        self.action_use()

    @on(Button.Pressed, "#use")
    def action_use(self) -> None:
        self.dismiss(self.Choice(self.editing))

    def action_close(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        name = self.query_one("#persona-name", Input).value
        prompt = self.query_one("#persona-prompt", TextArea).text
        editing = self.editing
        saved = attempt(self, lambda: self.personas.save(editing, name, prompt))
        if saved is not None:
            self.notify(
                f"Saved persona “{saved.name}”. Conversations using the old text keep it; pick it again to switch."
            )
            self.reload(select_id=saved.id)

    @on(Button.Pressed, "#new")
    def new(self) -> None:
        self.query_one("#persona-list", OptionList).highlighted = 0
        self._edit(None)
        self.query_one("#persona-name", Input).focus()
        self.notify("Type a name and a prompt, then Save (Ctrl+S).")

    @on(Button.Pressed, "#duplicate")
    def duplicate(self) -> None:
        if self.editing is None:
            self.notify("Highlight a persona to duplicate.", severity="warning")
            return
        editing = self.editing
        copy = attempt(self, lambda: self.personas.duplicate(editing))
        if copy is not None:
            self.reload(select_id=copy.id)

    @on(Button.Pressed, "#delete")
    def delete(self) -> None:
        if self.editing is None:
            self.notify("Highlight a persona to delete.", severity="warning")
            return
        editing = self.editing

        def delete_it() -> PersonaRecord:
            self.personas.delete(editing)
            return editing

        def decided(yes: bool | None) -> None:
            if yes and attempt(self, delete_it) is not None:
                self.reload()

        self.app.push_screen(Confirm(f"Delete the persona “{editing.name}”? Conversations keep their copy."), decided)

    @on(Button.Pressed, "#import")
    def import_file(self) -> None:
        def chosen(path: str | None) -> None:
            if path:
                record = attempt(self, lambda: self.personas.import_file(user_path(path)))
                if record is not None:
                    self.notify(f"Imported persona “{record.name}”.")
                    self.reload(select_id=record.id)

        self.app.push_screen(
            TextPrompt(
                "Import a persona from a file",
                placeholder="path to a .md or .txt file",
                hint="The first line '# Name' names it; otherwise the file name does.",
            ),
            chosen,
        )

    @on(Button.Pressed, "#export")
    def export(self) -> None:
        if self.editing is None:
            self.notify("Highlight a persona to export.", severity="warning")
            return
        editing = self.editing

        def chosen(path: str | None) -> None:
            if path:
                try:
                    written = self.personas.export(editing, user_path(path))
                except ChatappError as error:
                    self.notify(str(error), severity="error", timeout=10)
                    return
                self.notify(f"Exported to {written}")

        self.app.push_screen(TextPrompt(f"Export “{editing.name}” to", str(Path.home())), chosen)
