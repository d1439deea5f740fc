"""Settings: one field per setting, checked by pydantic; invalid values show their reason."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from chatapp.errors import SettingsError
from chatapp.services.settings_form import (
    changed_restart_fields,
    field_errors,
    format_value,
    parse_values,
    save_settings,
    setting_fields,
)
from chatapp.services.startup import Workspace
from chatapp.settings import Settings


class SettingsScreen(ModalScreen[Settings | None]):
    """Returns the saved settings (None when closed without saving)."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="settings.close"),
        Binding("ctrl+s", "save", "Save", id="settings.save", priority=True),
    ]

    def __init__(self, workspace: Workspace, suggested: dict[str, str] | None = None) -> None:
        """`suggested`: values (as typed) to put in their fields, e.g. a budget the cache's sizing advises;
        saved only when the user saves."""
        super().__init__(classes="dialog-screen")
        self.workspace = workspace
        self.fields = setting_fields()
        self.saved = workspace.saved_settings()
        self.suggested = suggested or {}

    def compose(self) -> ComposeResult:
        current = self.saved  # the file alone: one-off command-line options must not become permanent
        with Vertical(classes="dialog wide"):
            yield Label(
                f"Settings  ·  {self.workspace.paths.config_file}  ·  Ctrl+S saves  ·  Esc closes",
                classes="dialog-title",
            )
            if self.suggested:
                yield Label(
                    "Suggested, not saved yet: "
                    + ", ".join(f"{name} = {value}" for name, value in self.suggested.items())
                    + "  ·  Ctrl+S saves",
                    id="settings-suggested",
                )
            with VerticalScroll(id="settings-fields"):
                for field in self.fields:
                    with Vertical(classes="setting"):
                        restart = "  (after a restart)" if field.restart_needed else ""
                        yield Label(f"{field.label}{restart}", classes="setting-label")
                        yield Input(
                            self.suggested.get(field.name, format_value(field, getattr(current, field.name))),
                            placeholder=format_value(field, field.default) or "empty",
                            id=f"setting-{field.name}",
                        )
                        yield Label(field.description, classes="setting-help")
                        yield Label("", classes="setting-error", id=f"error-{field.name}")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def _texts(self) -> dict[str, str]:
        return {field.name: self.query_one(f"#setting-{field.name}", Input).value for field in self.fields}

    @on(Input.Changed)
    def _check(self) -> None:
        errors = field_errors(self._texts())
        for field in self.fields:
            label = self.query_one(f"#error-{field.name}", Label)
            label.update(errors.get(field.name, ""))
            self.query_one(f"#setting-{field.name}", Input).set_class(field.name in errors, "invalid")

    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        try:
            settings = parse_values(self._texts())
            save_settings(self.workspace.paths.config_file, settings)
        except SettingsError as error:
            self._check()
            self.notify(str(error), severity="error", timeout=10)
            return
        later = changed_restart_fields(self.saved, settings)
        message = "Settings saved."
        if later:
            message += f" Restart chatapp to apply: {', '.join(later)}."
        self.notify(message)
        self.dismiss(settings)

    @on(Button.Pressed, "#cancel")
    def action_close(self) -> None:
        self.dismiss(None)
