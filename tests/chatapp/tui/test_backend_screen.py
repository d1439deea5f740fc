"""The chat screen on a remote engine (a real `chatapp serve` on loopback), driven by Textual's pilot."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.benchmark.server_process import free_port
from chatapp.engine.gate import Step
from chatapp.tui.cache_screen import CacheScreen
from chatapp.tui.composer import Composer
from chatapp.tui.widgets import StatusLine
from tests.chatapp.tui.test_main_screen_documents import attach
from tests.server_support import Backend
from tests.tui_support import answers, footnote, make_app, notifications, running, send, views, wait_idle, wait_until

pytestmark = pytest.mark.slow
KEEPERS = "\n".join(f"In {1800 + n} the lamp was kept by keeper number {n}, who painted the door." for n in range(24))


async def test_answers_stream_from_the_backend_and_say_what_its_cache_reused(data_dir: Path, backend: Backend) -> None:
    app = make_app(data_dir, **backend.settings())
    async with running(app) as pilot:
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
    async with running(app) as pilot:
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


async def test_a_document_warmed_ahead_and_a_branch_on_the_backend(
    data_dir: Path, tmp_path: Path, backend: Backend
) -> None:
    document = tmp_path / "keepers.txt"
    document.write_text(KEEPERS, encoding="utf-8")
    app = make_app(data_dir, **backend.settings())
    async with running(app) as pilot:
        await attach(pilot, app, document)
        await wait_until(pilot, lambda: app.service.current.view().document is not None)
        await wait_idle(pilot, app)  # the warm-up sent when the document's branch opened has ended
        attached = app.service.current.view().document
        assert attached is not None
        document_tokens = app.service.document_tokens(attached)
        assert document_tokens is not None
        await send(pilot, app, "Who kept the lamp in 1850?")
        stats = app.service.current.view().messages[-1].record.stats
        assert stats is not None
        assert stats["reuse_tier"] == "server"
        assert stats["reused_tokens"] >= document_tokens, "warm-ahead put the document in the server's cache"
        assert "from the server's cache" in footnote(answers(app)[-1])

        await pilot.press("ctrl+g")  # edit the question: a sibling branch, answered by the backend too
        composer = app.main_screen.query_one(Composer)
        composer.text = "Who kept the lamp in 1851?"
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(views(app)) == 2 and views(app)[0].version_count == 2)
        await wait_idle(pilot, app)
        assert views(app)[0].text == "Who kept the lamp in 1851?"
        assert answers(app)[0].text


@pytest.mark.parametrize(
    ("wrong", "expected"),
    [("key", "refused the API key (HTTP 401)"), ("address", "cannot reach the engine at")],
)
async def test_a_wrong_key_and_an_unreachable_backend_are_one_notification_each(
    data_dir: Path, backend: Backend, wrong: str, expected: str
) -> None:
    settings = (
        {"backend": backend.url, "backend_key": "wrong"}
        if wrong == "key"
        else {"backend": f"http://127.0.0.1:{free_port()}"}
    )
    app = make_app(data_dir, **settings)
    async with running(app, ready=False) as pilot:
        await wait_until(pilot, lambda: any(expected in note for note in notifications(app)))
        failures = [note for note in notifications(app) if expected in note]
        assert len(failures) == 1
        assert "\n" not in failures[0]
        assert not app.service.slot.ready
