"""The cache screen: tiers, hit rate, first-token sparkline, pin and unpin, clear."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import DataTable, OptionList, Sparkline

from chatapp.tui.cache_screen import CacheScreen
from chatapp.tui.dialogs import Confirm
from tests.tui_support import engine_of, make_app, notifications, running, send, wait_until


async def test_tiers_pins_and_clear(data_dir: Path) -> None:
    app = make_app(data_dir)
    async with running(app) as pilot:
        persona = app.library.personas.get_by_name("Concise assistant")
        await app.main_screen.conversations.use_persona(persona)
        await send(pilot, app, "Name a colour.")
        await send(pilot, app, "Name another.")
        engine = engine_of(app)
        assert engine.cache is not None
        engine.flush_cache()
        await pilot.press("f4")
        await wait_until(pilot, lambda: isinstance(app.screen, CacheScreen))
        screen = app.screen
        table = screen.query_one(DataTable)
        assert [table.get_row_at(i)[0] for i in range(table.row_count)] == ["Live context", "RAM", "Disk"]
        assert int(table.get_row_at(2)[1].replace(",", "")) > 0, "the answers' blocks are on disk"
        assert int(table.get_row_at(0)[4].replace(",", "")) > 0, "the second answer reused the first from the context"
        first_tokens = screen.query_one(Sparkline).data
        assert first_tokens is not None
        assert len(first_tokens) == 2
        assert "Hit rate" in str(screen.query_one("#cache-summary").render())
        # The second question went on from the first: no prompt left an earlier one part-way.
        assert "No prompt this session" in str(screen.query_one("#cache-divergence").render())

        await pilot.click("#pin-persona")
        await wait_until(pilot, lambda: any("Pinned the persona" in n for n in notifications(app)))
        await wait_until(
            pilot,
            lambda: "Concise assistant" in str(screen.query_one("#pins", OptionList).get_option_at_index(0).prompt),
        )
        assert engine.cache.stats()["pinned_entries"] > 0

        await pilot.click("#clear")
        await wait_until(pilot, lambda: isinstance(app.screen, Confirm))
        await pilot.click("#yes")
        await wait_until(pilot, lambda: any("Cleared" in n for n in notifications(app)))
        await wait_until(pilot, lambda: screen.query_one("#pins", OptionList).get_option_at_index(0).id == "none")
        assert engine.cache.stats()["index_entries"] == 0
