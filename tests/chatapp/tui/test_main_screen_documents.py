"""Documents: attach one, ask two questions in Q&A mode, the second reuses the document's KV."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from chatapp.tui.app import ChatApp
from chatapp.tui.document_picker import DocumentPicker
from tests.tui_support import make_app, notifications, running, send, views, wait_idle, wait_until

NOTES = "\n".join(
    f"Line {n}: the lighthouse at Cape {n} was built in {1800 + n} and painted red and white." for n in range(1, 13)
)


async def attach(pilot: Pilot[None], app: ChatApp, path: Path) -> None:
    """Type the path into the document picker and press Enter."""
    await pilot.press("ctrl+o")
    await wait_until(pilot, lambda: isinstance(app.screen, DocumentPicker))
    app.screen.query_one("#document-path", Input).value = str(path)
    await pilot.press("enter")


async def test_questions_about_a_document_reuse_its_tokens(data_dir: Path, tmp_path: Path) -> None:
    document = tmp_path / "lighthouses.txt"
    document.write_text(NOTES, encoding="utf-8")
    app = make_app(data_dir)
    async with running(app) as pilot:
        await attach(pilot, app, document)
        await wait_until(pilot, lambda: app.service.current.view().document is not None)
        await wait_idle(pilot, app)  # the screen shows the document's branch before Ctrl+T
        info = str(app.main_screen.query_one("#branch-info").render())
        assert "Document: lighthouses.txt" in info
        assert "of 1,024 tokens" in info
        attached = app.service.current.view().document
        assert attached is not None
        document_tokens = app.service.document_tokens(attached)
        assert document_tokens is not None
        assert document_tokens > 200

        await pilot.press("ctrl+t")
        await wait_until(pilot, lambda: app.service.current.view().conversation.qa_mode)
        await wait_idle(pilot, app)
        await send(pilot, app, "When was the lighthouse at Cape 3 built?")
        await send(pilot, app, "What colours are the lighthouses?")
        branch = app.service.current.view()
        assert [m.record.role for m in branch.messages] == ["user", "assistant"], "Q&A mode: history does not grow"
        assert branch.messages[0].record.content == "What colours are the lighthouses?"
        assert (branch.messages[0].position, branch.messages[0].siblings) == (2, 2)
        stats = branch.messages[1].record.stats
        assert stats is not None
        assert stats["reused_tokens"] >= document_tokens, "the second question reuses the whole document"
        assert len(views(app)) == 2


async def test_a_document_that_does_not_fit_names_both_numbers(data_dir: Path, tmp_path: Path) -> None:
    document = tmp_path / "long.txt"
    document.write_text(NOTES * 8, encoding="utf-8")
    app = make_app(data_dir, context_cap=512)
    async with running(app) as pilot:
        await attach(pilot, app, document)
        await wait_until(pilot, lambda: any("context holds" in n for n in notifications(app)))
        message = next(n for n in notifications(app) if "context holds" in n)
        assert "long.txt" in message
        assert "512" in message
        assert app.service.current.view().document is None


async def test_an_unreadable_document_is_a_notification(data_dir: Path, tmp_path: Path) -> None:
    document = tmp_path / "latin1.txt"
    document.write_bytes("caf\u00e9".encode("latin-1"))  # passes the picker's check, fails the read
    app = make_app(data_dir)
    async with running(app) as pilot:
        await attach(pilot, app, document)
        await wait_until(pilot, lambda: any("not UTF-8" in n for n in notifications(app)))
        await wait_idle(pilot, app)
        assert app.service.current.view().document is None


async def test_a_long_warm_up_shows_its_progress(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chatapp.tui.main_screen import MainScreen
    from chatapp.tui.widgets import PrefillRow

    shown: list[str] = []
    original = PrefillRow.show_progress

    def recording(self: PrefillRow, what: str, done: int, total: int) -> None:
        shown.append(f"{what} {done}/{total}")
        original(self, what, done, total)

    monkeypatch.setattr(PrefillRow, "show_progress", recording)
    document = tmp_path / "notes.txt"
    document.write_text(
        NOTES + "\n" + NOTES.replace("Cape", "Point"), encoding="utf-8"
    )  # more than one 512-token batch
    app = make_app(data_dir)
    async with running(app) as pilot:
        await attach(pilot, app, document)
        await wait_until(pilot, lambda: app.service.current.view().document is not None)
        await wait_idle(pilot, app)
        assert isinstance(app.main_screen, MainScreen)
        assert not app.main_screen.query_one(PrefillRow).display, "the bar goes away when the warm-up ends"
    assert any(entry.startswith("warming up 512/") for entry in shown), shown
