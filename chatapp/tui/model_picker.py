"""F7: the models on this machine, as `chatapp models` lists them; Enter switches to one, Esc closes."""

from __future__ import annotations

from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

from chatapp.services.model_choice import ModelChoice
from chatapp.services.model_list import COLUMNS

HINT = "Enter: load it beside the model answering, then switch (Esc cancels). More folders: model_folders (F5)."


class ModelPicker(ModalScreen[Path | None]):
    """A table of the models found; returns the chosen model's file, or None."""

    BINDINGS = [Binding("escape", "cancel", "Close", id="dialog.cancel")]

    def __init__(self, choices: list[ModelChoice]) -> None:
        super().__init__(classes="dialog-screen")
        self.choices = choices

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide-dialog"):
            yield Label(f"Models on this machine ({len(self.choices)})", classes="dialog-title")
            yield DataTable(id="models", cursor_type="row", zebra_stripes=True)
            yield Label("", id="model-problem", classes="dialog-hint")
            yield Label(HINT, classes="dialog-hint")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_column("", key="mark")
        for column in COLUMNS[:-1]:
            table.add_column(column.capitalize(), key=column)
        table.add_column("Note", key="note")
        for index, choice in enumerate(self.choices):
            mark = "●" if choice.current else ("✗" if choice.problem else " ")
            note = "answering now" if choice.current else choice.problem
            table.add_row(mark, *choice.fields[:-1], note, key=str(index))
        if not self.choices:
            self.query_one("#model-problem", Label).update(
                "No GGUF models found in Ollama's, LM Studio's, the Hugging Face cache's or llama.cpp's folders."
            )
        table.focus()

    @on(DataTable.RowSelected)
    def chosen(self, event: DataTable.RowSelected) -> None:
        choice = self.choices[int(str(event.row_key.value))]
        if choice.current:
            self.dismiss(None)
        elif choice.problem:
            self.query_one("#model-problem", Label).update(f"{choice.name}: {choice.problem}")
            self.notify(f"{choice.name}: {choice.problem}", severity="error", timeout=8)
        else:
            self.dismiss(choice.path)

    def action_cancel(self) -> None:
        self.dismiss(None)
