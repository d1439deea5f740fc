"""The keys: every command of the table with its key, plus the keys widgets handle."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

from chatapp.tui.commands import COMMANDS, WIDGET_KEYS, display_key


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "close", "Close", id="help.close")]

    def __init__(self) -> None:
        super().__init__(classes="dialog-screen")

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label(
                "Keys  ·  every action is also in the command palette (Ctrl+P)  ·  Esc closes", classes="dialog-title"
            )
            yield DataTable(id="keys", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("Key", "Action", "What it does")
        for command in COMMANDS:
            table.add_row(display_key(command.key), command.title, command.help, key=command.id)
        for key, text in WIDGET_KEYS:
            table.add_row(display_key(key), "", text)
        table.focus()

    def action_close(self) -> None:
        self.dismiss(None)
