"""Sizing the tiers on the cache screen: the plot of reuse against budget, and a suggestion the settings
screen fills in (saved only when the user saves)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from textual.widgets import Button, Input
from textual_plotext import PlotextPlot

from chatapp.settings import load_settings
from chatapp.tui.cache_advice_screen import CacheAdviceScreen
from chatapp.tui.cache_screen import CacheScreen
from chatapp.tui.settings_screen import SettingsScreen
from tests.tui_support import engine_of, make_app, running, send, wait_until


async def test_the_cache_screen_sizes_the_tiers_and_a_suggestion_reaches_the_settings(data_dir: Path) -> None:
    app = make_app(data_dir)
    async with running(app) as pilot:
        await send(pilot, app, "Name a colour.")
        await send(pilot, app, "Name another.")
        engine_of(app).flush_cache()
        await pilot.press("f4")
        await wait_until(pilot, lambda: isinstance(app.screen, CacheScreen))
        await pilot.click("#advise")
        await wait_until(pilot, lambda: isinstance(app.screen, CacheAdviceScreen))
        screen = app.screen
        assert isinstance(screen, CacheAdviceScreen)
        await wait_until(pilot, lambda: screen.advice is not None)
        advice = screen.advice
        assert advice is not None
        assert advice.requests == 2
        assert "2 requests" in str(screen.query_one("#advice-summary").render())
        assert screen.query_one(PlotextPlot).display
        # Two requests say too little to suggest a budget: nothing to apply.
        assert advice.suggested_disk_mib is None
        assert screen.query_one("#apply", Button).disabled
        assert "too few requests" in str(screen.query_one("#advice-suggestion").render())

        # With a suggestion (as a long log gives), Apply opens the settings with it filled in.
        screen._show(replace(advice, suggested_disk_mib=2048, suggestion="2.0 GiB of disk would still keep it"))
        await pilot.pause()
        assert not screen.query_one("#apply", Button).disabled
        await pilot.click("#apply")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        settings_screen = app.screen
        assert settings_screen.query_one("#setting-cache_disk_mib", Input).value == "2048"
        assert "cache_disk_mib = 2048" in str(settings_screen.query_one("#settings-suggested").render())
        assert load_settings(app.workspace.paths.config_file).cache_disk_mib != 2048  # not saved yet
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert load_settings(app.workspace.paths.config_file).cache_disk_mib == 2048
