"""F7: the models on this machine; switching loads the new one while the old one answers,
a conversation keeps its model, Esc cancels a load; on the bundled model and a tiny one."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.widgets import DataTable, Label

from chatapp.model_files import bundled_model_path
from chatapp.services.engine_slot import EngineSlot
from chatapp.tui.model_picker import ModelPicker
from chatapp.tui.sidebar import Sidebar
from chatapp.tui.widgets import PrefillRow, StatusLine
from tests.model_factory import write_tiny_llama
from tests.tui_support import answers, footnote, make_app, notifications, running, send, wait_until

BUNDLED = bundled_model_path().stem


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tiny model in a models folder, and a home with no other tool's models in it."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    for variable in ("OLLAMA_MODELS", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "LLAMA_CACHE"):
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "models").mkdir()
    return write_tiny_llama(tmp_path / "models" / "tiny.gguf")


def status(app: object) -> str:
    return str(app.main_screen.query_one(StatusLine).render())  # type: ignore[attr-defined]


async def choose(pilot: object, app: object, name: str) -> None:
    """F7, then Enter on `name`'s row."""
    await pilot.press("f7")  # type: ignore[attr-defined]
    await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker))  # type: ignore[arg-type, attr-defined]
    picker = app.screen  # type: ignore[attr-defined]
    row = next(index for index, choice in enumerate(picker.choices) if choice.name == name)
    picker.query_one(DataTable).move_cursor(row=row)
    await pilot.press("enter")  # type: ignore[attr-defined]


async def test_switching_models_and_back_to_a_conversation_s_own(data_dir: Path, tiny: Path) -> None:
    app = make_app(data_dir, max_tokens=6, model_folders=str(tiny.parent))
    async with running(app) as pilot:
        persona = "You are terse. " * 30  # a prefix long enough to be cached in blocks
        app.service.current.new_conversation()
        await send(pilot, app, persona + "Name a colour.")
        first = app.service.current.conversation_id
        assert first is not None
        assert BUNDLED in footnote(answers(app)[-1]), "each answer names its model"

        await pilot.press("f7")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker))
        picker = app.screen
        assert isinstance(picker, ModelPicker)
        assert [(choice.name, choice.current) for choice in picker.choices] == [(BUNDLED, True), ("tiny", False)]
        assert picker.query_one(DataTable).row_count == 2
        await pilot.press("escape")

        await pilot.press("ctrl+n")
        await choose(pilot, app, "tiny")
        await wait_until(pilot, lambda: app.service.slot.model_label() == "tiny" and "ready" in status(app))
        assert "tiny" in status(app)
        assert any("Now answering with tiny" in note for note in notifications(app))
        await send(pilot, app, "Hello")
        assert "tiny" in footnote(answers(app)[-1])
        assert app.service.current.view().conversation.model == str(tiny.resolve())

        # Back to the first conversation: its model comes back, and its prefix from the cache.
        app.main_screen.post_message(Sidebar.ConversationChosen(first))
        await wait_until(pilot, lambda: app.service.slot.model_label() == BUNDLED and "ready" in status(app))
        await send(pilot, app, persona + "Name a fruit.")
        assert BUNDLED in footnote(answers(app)[-1])
        assert "reused" in footnote(answers(app)[-1])
        last = app.service.current.view().messages[-1].record.stats or {}
        assert last["reused_tokens"] > 0


async def test_esc_cancels_a_load_and_the_old_model_stays(
    data_dir: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real load is held at its first progress report until Esc has been pressed."""
    reported, go_on = threading.Event(), threading.Event()
    real = EngineSlot.prepare

    def held(
        self: EngineSlot,
        path: Path,
        progress: Callable[[float], bool] | None = None,
        cancelled: threading.Event | None = None,
    ) -> None:
        def first_waits(share: float) -> bool:
            reported.set()
            go_on.wait(timeout=600)
            return progress(share) if progress is not None else True

        real(self, path, first_waits, cancelled)

    monkeypatch.setattr(EngineSlot, "prepare", held)
    app = make_app(data_dir, model_folders=str(tiny.parent))
    async with running(app) as pilot:
        await choose(pilot, app, "tiny")
        await wait_until(pilot, reported.is_set)
        assert "loading tiny.gguf" in status(app)
        row = app.main_screen.query_one(PrefillRow)
        # A load held past the moment a progress bar is worth drawing shows its share and the way out.
        await wait_until(pilot, lambda: row.display)
        assert "loading tiny.gguf" in str(row.query_one("#prefill-label", Label).render())
        assert "Esc cancels" in str(row.query_one("#prefill-label", Label).render())
        await pilot.press("escape")
        go_on.set()
        await wait_until(pilot, lambda: "stayed with" in status(app))
        assert not row.display
        await pilot.pause(0.2)
        assert app.service.slot.model_label() == BUNDLED
        await send(pilot, app, "Hi")
        assert BUNDLED in footnote(answers(app)[-1])
