"""Snapshots of the main screens (pytest-textual-snapshot); `--snapshot-update` refreshes them."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, Label, TextArea, Tree

from chatapp.services.library import open_library
from chatapp.services.startup import open_workspace
from chatapp.tui.app import ChatApp
from chatapp.vocabulary import Role
from tests.tui_support import SCREEN, TEST_SETTINGS, wait_idle, wait_ready, wait_until

ANSWER = """Three tips:

1. **Keep it short.** One idea per sentence.
2. Use examples:

```python
print("hello")
```
"""
STATS = {
    "prompt_tokens": 212,
    "reused_tokens": 196,
    "computed_tokens": 16,
    "reuse_tier": "disk",
    "generated_tokens": 41,
    "ttft_ms": 93.0,
    "total_ms": 700.0,
    "decode_tokens_per_s": 70.1,
    "stop_reason": "end",
}


def seeded_app(data_dir: Path) -> ChatApp:
    """An app whose database already holds a conversation with two answers to one question."""
    workspace = open_workspace(str(data_dir), TEST_SETTINGS)
    library = open_library(workspace)
    store = library.conversations
    persona = library.personas.get_by_name("Concise assistant")
    conversation = store.create_conversation("Writing tips")
    root = store.add_root(conversation.id, persona_name=persona.name, persona_prompt=persona.prompt, document_id=None)
    question = store.add_message(conversation.id, root.id, Role.USER, "How do I write clearly?")
    store.add_message(
        conversation.id, question.id, Role.ASSISTANT, "Write short sentences.", generated_ids=(1, 2), stats=STATS
    )
    store.add_message(conversation.id, question.id, Role.ASSISTANT, ANSWER, generated_ids=(3, 4), stats=STATS)
    return ChatApp(workspace, library)


async def settle(pilot: Pilot[None]) -> None:
    app = pilot.app
    assert isinstance(app, ChatApp)
    await wait_ready(pilot, app)
    await wait_idle(pilot, app)
    app.clear_notifications()
    await pilot.pause()  # the messages those changes posted
    steady(pilot)


def steady(pilot: Pilot[None]) -> None:
    """No blinking cursors, and no temporary folder names, in the picture."""
    for field in pilot.app.screen.query(Input):
        field.cursor_blink = False
    for area in pilot.app.screen.query(TextArea):
        area.cursor_blink = False
    for label in pilot.app.screen.query(".dialog-title").results(Label):
        text = str(label.render())
        if "/" in text:
            label.update(re.sub(r"/\S+/config\.toml", "DATA/config.toml", text))


@pytest.fixture
def seeded(data_dir: Path) -> ChatApp:
    return seeded_app(data_dir)


def test_main_screen(snap_compare, seeded: ChatApp) -> None:
    assert snap_compare(seeded, terminal_size=SCREEN, run_before=settle)


def opening(key: str, screen: str, *, pause_after: bool = False) -> Callable[[Pilot[None]], Awaitable[None]]:
    """A `run_before` that settles the app, presses `key` and waits for the screen class named `screen`."""

    async def open_screen(pilot: Pilot[None]) -> None:
        await settle(pilot)
        await pilot.press(key)
        await wait_until(pilot, lambda: type(pilot.app.screen).__name__ == screen)
        await pilot.pause()
        steady(pilot)
        if pause_after:
            await pilot.pause()

    return open_screen


def test_persona_screen(snap_compare, seeded: ChatApp) -> None:
    assert snap_compare(seeded, terminal_size=SCREEN, run_before=opening("f2", "PersonaScreen"))


def test_help_screen(snap_compare, seeded: ChatApp) -> None:
    assert snap_compare(seeded, terminal_size=SCREEN, run_before=opening("f1", "HelpScreen"))


def test_settings_screen(snap_compare, seeded: ChatApp) -> None:
    assert snap_compare(seeded, terminal_size=SCREEN, run_before=opening("f5", "SettingsScreen", pause_after=True))


def test_document_picker(snap_compare, seeded: ChatApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = tmp_path / "docs"
    (docs / "archive").mkdir(parents=True)
    for name in ("lighthouses.txt", "plan.md", "paper.pdf", "photo.png", ".hidden.md"):
        (docs / name).write_text("text", encoding="utf-8")
    monkeypatch.chdir(docs)  # no document attached yet: the picker starts in the working directory

    async def open_picker(pilot: Pilot[None]) -> None:
        await settle(pilot)
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: type(pilot.app.screen).__name__ == "DocumentPicker")
        tree = pilot.app.screen.query_one("#document-tree", Tree)
        await wait_until(pilot, lambda: bool(tree.root.children))
        field = pilot.app.screen.query_one("#document-path", Input)
        field.value = ""  # the folder's temporary path would change the picture; a relative name completes too
        await pilot.press("p", "l")
        await wait_until(pilot, lambda: field._suggestion == "plan.md")
        steady(pilot)
        await pilot.pause()

    assert snap_compare(seeded, terminal_size=SCREEN, run_before=open_picker)
