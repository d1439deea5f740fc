"""The chat screen on a remote engine (a real `chatapp serve` on loopback), driven by Textual's pilot."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.engine.gate import Step
from chatapp.tui.cache_screen import CacheScreen
from chatapp.tui.widgets import StatusLine
from tests.server_support import Backend
from tests.tui_support import SCREEN, answers, footnote, make_app, notifications, send, wait_ready, wait_until

pytestmark = pytest.mark.slow


async def test_answers_stream_from_the_backend_and_say_what_its_cache_reused(data_dir: Path, backend: Backend) -> None:
    app = make_app(data_dir, **backend.settings())
    async with app.run_test(size=SCREEN) as pilot:
        await wait_ready(pilot, app)
        await send(pilot, app, "Name a famous lighthouse.")
        await send(pilot, app, "Where is it?")
        first, second = answers(app)
        assert first.text
        assert second.text
        assert "from the server's cache" in footnote(second)
        status = str(app.main_screen.query_one(StatusLine).render())
        assert "from server" in status
        await pilot.press("f4")
        await wait_until(pilot, lambda: isinstance(app.screen, CacheScreen))
        screen = app.screen
        assert isinstance(screen, CacheScreen)
        assert screen.overview is not None
        assert screen.overview.server == backend.url
        assert not screen.query_one("#tiers").display  # no local tiers, pins or actions to show
        assert not screen.query_one("#pins").display


async def test_a_backend_dying_mid_answer_keeps_the_partial_answer_and_says_so(
    data_dir: Path, backend: Backend
) -> None:
    app = make_app(data_dir, max_tokens=40, **backend.settings())
    async with app.run_test(size=SCREEN) as pilot:
        await wait_ready(pilot, app)
        with backend.server.engine.holding(Step.TOKEN, 3) as gate:

            async def cut_when_held() -> None:
                await wait_until(pilot, gate.holding.is_set)
                backend.proxy.cut()

            app.run_worker(cut_when_held())
            await send(pilot, app, "Tell me a long story about a lighthouse keeper.")
        assert any("the answer failed" in note and "broke" in note for note in notifications(app))
        answer = answers(app)[-1]
        assert answer.text
        assert "the engine failed while answering" in footnote(answer)
