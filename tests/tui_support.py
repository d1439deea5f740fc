"""Driving the TUI with Textual's pilot on the real bundled model."""

from __future__ import annotations

from pathlib import Path

from chatapp.services.startup import open_workspace
from chatapp.tui.app import ChatApp
from chatapp.tui.chat_log import ChatLog
from chatapp.tui.composer import Composer
from chatapp.tui.widgets import MessageView

SCREEN = (120, 36)
# Greedy answers are reproducible; short ones keep the suite fast on two cores.
# One llama.cpp thread: the UI thread needs a core too, and llama.cpp's spinning thread
# barriers slow down badly when its threads have to share one.
TEST_SETTINGS = {"temperature": 0.0, "context_cap": 1024, "sequences": 2, "max_tokens": 12, "threads": 1}


def make_app(data_dir: Path, **overrides: object) -> ChatApp:
    return ChatApp(open_workspace(str(data_dir), {**TEST_SETTINGS, **overrides}))


async def wait_until(pilot, condition, timeout: float = 90.0) -> None:  # type: ignore[no-untyped-def]
    waited = 0.0
    while not condition():
        assert waited < timeout, "timed out waiting for the app"
        await pilot.pause(0.02)
        waited += 0.02


async def wait_ready(pilot, app: ChatApp) -> None:  # type: ignore[no-untyped-def]
    await wait_until(pilot, lambda: app.service.ready)
    await wait_idle(pilot, app)


async def wait_idle(pilot, app: ChatApp) -> None:  # type: ignore[no-untyped-def]
    """No answer running and the engine has nothing queued (warm-ups included)."""
    await wait_until(pilot, lambda: not app.main_screen.answering)
    if app.engine is not None:
        await pilot.pause(0.05)
        await wait_until(pilot, lambda: app.service.prewarmer is None or not app.service.prewarmer.busy)


async def send(pilot, app: ChatApp, text: str) -> None:  # type: ignore[no-untyped-def]
    composer = app.main_screen.query_one(Composer)
    composer.focus()
    composer.text = text
    count = len(answers(app))
    await pilot.press("enter")
    await wait_until(pilot, lambda: len(answers(app)) > count or bool(app._notifications))
    await wait_idle(pilot, app)


def views(app: ChatApp) -> list[MessageView]:
    return app.main_screen.query_one(ChatLog).views


def answers(app: ChatApp) -> list[MessageView]:
    return [view for view in views(app) if view.role == "assistant"]


def footnote(view: MessageView) -> str:
    return str(view.query_one(".footnote").render())


def notifications(app: ChatApp) -> list[str]:
    return [notification.message for notification in app._notifications]
