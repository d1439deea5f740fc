"""The settings screen: invalid values show pydantic's reason; valid ones are saved to config.toml."""

from __future__ import annotations

import tomllib
from pathlib import Path

from textual.widgets import Input, Label

from chatapp.services.startup import open_workspace
from chatapp.tui.app import ChatApp
from chatapp.tui.settings_screen import SettingsScreen
from tests.tui_support import notifications, running, wait_until


async def test_invalid_values_are_explained_and_valid_ones_saved(data_dir: Path) -> None:
    # As if started with `chatapp --context 1024 --threads 1`: one-off options, not to be saved.
    app = ChatApp(open_workspace(str(data_dir), {"context_cap": 1024, "threads": 1}))
    async with running(app, ready=False) as pilot:
        await pilot.press("f5")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        screen = app.screen
        screen.query_one("#setting-temperature", Input).value = "9"
        error = screen.query_one("#error-temperature", Label)
        await wait_until(pilot, lambda: "less than or equal to 5" in str(error.render()))
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: any("Temperature" in n for n in notifications(app)))
        assert isinstance(app.screen, SettingsScreen), "an invalid form is not saved"
        assert not app.workspace.paths.config_file.exists()

        screen.query_one("#setting-temperature", Input).value = "0.3"
        screen.query_one("#setting-cache_ram_mib", Input).value = "256"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        saved = tomllib.loads(app.workspace.paths.config_file.read_text())
        assert saved["temperature"] == 0.3
        assert saved["cache_ram_mib"] == 256
        assert "context_cap" not in saved, "command-line options stay one-off"
        assert "threads" not in saved, "command-line options stay one-off"
        assert app.workspace.settings.context_cap == 1024, "and still apply to this run"
        assert app.workspace.settings.temperature == 0.3
        assert app.service.workspace.sampling().temperature == 0.3
        assert any("Restart chatapp to apply: Cache RAM MiB" in n for n in notifications(app))
