"""Every action has a key with an id, appears in help, and is in the command palette."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import DataTable

from chatapp.tui.commands import COMMANDS, display_key
from chatapp.tui.help_screen import HelpScreen
from tests.tui_support import make_app, running, wait_until


def test_every_command_has_a_unique_key_and_id() -> None:
    assert len({c.id for c in COMMANDS}) == len(COMMANDS)
    assert len({c.key for c in COMMANDS}) == len(COMMANDS)
    assert display_key("ctrl+n") == "Ctrl+N"
    assert display_key("alt+left") == "Alt+Left"


async def test_help_lists_every_key_and_the_palette_every_action(data_dir: Path) -> None:
    app = make_app(data_dir)
    async with running(app, ready=False) as pilot:
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        table = app.screen.query_one(DataTable)
        rows = [table.get_row_at(i) for i in range(table.row_count)]
        for command in COMMANDS:
            assert [display_key(command.key), command.title, command.help] in rows
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, HelpScreen))

        titles = [command.title for command in app.get_system_commands(app.screen)]
        for command in COMMANDS:
            assert any(title.startswith(command.title) for title in titles), command.title
        bound = {b.id for bs in app.main_screen._bindings.key_to_bindings.values() for b in bs}
        assert {c.id for c in COMMANDS} <= bound


def test_the_manual_lists_every_key() -> None:
    keys_section = (Path(__file__).resolve().parents[3] / "docs" / "chat-screen.md").read_text(encoding="utf-8")
    for command in COMMANDS:
        key = display_key(command.key).replace("Escape", "Esc")
        assert key in keys_section, f"docs/chat-screen.md does not mention {key} ({command.title})"
