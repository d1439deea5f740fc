"""Snapshots of the main screens (pytest-textual-snapshot); `--snapshot-update` refreshes them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chatapp.services.library import open_library
from chatapp.services.startup import open_workspace
from chatapp.tui.app import ChatApp
from tests.tui_support import SCREEN, TEST_SETTINGS, wait_idle, wait_ready, wait_until

ANSWER = """Three tips:

1. **Keep it short.** One idea per sentence.
2. Use examples:

```python
print("hello")
```
"""
STATS = {"prompt_tokens": 212, "reused_tokens": 196, "computed_tokens": 16, "reuse_tier": "disk",
         "generated_tokens": 41, "ttft_ms": 93.0, "total_ms": 700.0, "decode_tokens_per_s": 70.1, "stop_reason": "end"}


def seeded_app(data_dir: Path) -> ChatApp:
    """An app whose database already holds a conversation with two answers to one question."""
    workspace = open_workspace(str(data_dir), TEST_SETTINGS)
    library = open_library(workspace)
    store = library.conversations
    persona = library.personas.get_by_name("Concise assistant")
    conversation = store.create_conversation("Writing tips")
    root = store.add_root(conversation.id, persona_name=persona.name, persona_prompt=persona.prompt, document_id=None)
    question = store.add_message(conversation.id, root.id, "user", "How do I write clearly?")
    store.add_message(conversation.id, question.id, "assistant", "Write short sentences.", generated_ids=(1, 2), stats=STATS)
    store.add_message(conversation.id, question.id, "assistant", ANSWER, generated_ids=(3, 4), stats=STATS)
    return ChatApp(workspace, library)


async def settle(pilot) -> None:  # type: ignore[no-untyped-def]
    app = pilot.app
    await wait_ready(pilot, app)
    await wait_idle(pilot, app)
    app.clear_notifications()
    await pilot.pause(0.2)
    steady(pilot)


def steady(pilot) -> None:  # type: ignore[no-untyped-def]
    """No blinking cursors, and no temporary folder names, in the picture."""
    for widget in pilot.app.screen.query("Input, TextArea"):
        widget.cursor_blink = False
    for label in pilot.app.screen.query(".dialog-title"):
        text = str(label.render())
        if "/" in text:
            label.update(re.sub(r"/\S+/config\.toml", "DATA/config.toml", text))


@pytest.fixture
def seeded(data_dir: Path) -> ChatApp:
    return seeded_app(data_dir)


def test_main_screen(snap_compare, seeded: ChatApp) -> None:
    assert snap_compare(seeded, terminal_size=SCREEN, run_before=settle)


def test_persona_screen(snap_compare, seeded: ChatApp) -> None:
    async def open_personas(pilot) -> None:  # type: ignore[no-untyped-def]
        await settle(pilot)
        await pilot.press("f2")
        await wait_until(pilot, lambda: type(pilot.app.screen).__name__ == "PersonaScreen")
        await pilot.pause(0.2)
        steady(pilot)

    assert snap_compare(seeded, terminal_size=SCREEN, run_before=open_personas)


def test_help_screen(snap_compare, seeded: ChatApp) -> None:
    async def open_help(pilot) -> None:  # type: ignore[no-untyped-def]
        await settle(pilot)
        await pilot.press("f1")
        await pilot.pause(0.2)
        steady(pilot)

    assert snap_compare(seeded, terminal_size=SCREEN, run_before=open_help)


def test_settings_screen(snap_compare, seeded: ChatApp) -> None:
    async def open_settings(pilot) -> None:  # type: ignore[no-untyped-def]
        await settle(pilot)
        await pilot.press("f5")
        await pilot.pause(0.2)
        steady(pilot)
        await pilot.pause(0.1)

    assert snap_compare(seeded, terminal_size=SCREEN, run_before=open_settings)
