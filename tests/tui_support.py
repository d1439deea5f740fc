"""Driving the TUI with Textual's pilot on the real bundled model."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from textual.app import App
from textual.pilot import Pilot
from textual.worker import WorkerState

from chatapp.engine.engine import Engine
from chatapp.services.startup import open_workspace
from chatapp.tui.app import ChatApp
from chatapp.tui.chat_log import ChatLog
from chatapp.tui.composer import Composer
from chatapp.tui.widgets import MessageView
from tests.conftest import local

SCREEN = (120, 36)
# Greedy answers are reproducible; short ones keep the suite fast on two cores.
# One llama.cpp thread: the UI thread needs a core too, and llama.cpp's spinning thread
# barriers slow down badly when its threads have to share one.
TEST_SETTINGS = {"temperature": 0.0, "context_cap": 1024, "sequences": 2, "max_tokens": 12, "threads": 1}


def make_app(data_dir: Path, **overrides: object) -> ChatApp:
    return ChatApp(open_workspace(str(data_dir), {**TEST_SETTINGS, **overrides}))


async def wait_until(pilot: Pilot[None], condition: Callable[[], object], timeout: float = 600.0) -> None:
    """Pause until `condition` holds. The timeout only guards against a hang: nothing here races the app."""
    waited = 0.0
    while not condition():
        assert waited < timeout, "timed out waiting for the app"
        await pilot.pause(0.02)
        waited += 0.02


def engine_of(app: ChatApp) -> Engine:
    """The app's engine, for a test that holds it at a step (`engine_of(app).holding(...)`)."""
    assert app.service.slot.engine is not None, "the model is not loaded yet: wait_ready first"
    return local(app.service.slot.engine)


async def wait_ready(pilot: Pilot[None], app: ChatApp) -> None:
    await wait_until(pilot, lambda: app.service.slot.ready)
    await wait_idle(pilot, app)


@asynccontextmanager
async def running(app: App[None], *, ready: bool = True) -> AsyncIterator[Pilot[None]]:
    """The app run by Textual's pilot on a SCREEN-sized terminal; unless `ready` is False, once
    its model is loaded and the app is idle (`wait_ready`)."""
    async with app.run_test(size=SCREEN) as pilot:
        if ready:
            assert isinstance(app, ChatApp), "only the chat app loads a model"
            await wait_ready(pilot, app)
        yield pilot


SCREEN_WORKERS = ("engine", "answer", "warm", "document")


def idle(app: ChatApp) -> bool:
    """No answer, document read or warm-up under way: not on the screen, its workers, or the engine."""
    screen = app.main_screen
    working = any(
        worker.group in SCREEN_WORKERS and worker.state in (WorkerState.PENDING, WorkerState.RUNNING)
        for worker in app.workers
    )
    prewarmer = app.service.slot.prewarmer
    return not (screen.answering or screen.documents.reading or working or (prewarmer is not None and prewarmer.busy))


async def wait_idle(pilot: Pilot[None], app: ChatApp) -> None:
    """Until the app is idle: every answer and warm-up started so far has ended and been shown."""
    await wait_until(pilot, lambda: idle(app))


async def send(pilot: Pilot[None], app: ChatApp, text: str) -> None:
    """Type `text` and press Enter, then wait until its answer ended (or the app refused it) and all settled.

    An answer that starts is counted by the service when it ends; a refusal is a new
    notification. Neither depends on how fast the answer is, or on Q&A mode replacing views.
    """
    composer = app.main_screen.query_one(Composer)
    composer.focus()
    composer.text = text
    answered = len(app.service.figures.ttft_ms)
    shown_before = {notification.identity for notification in app._notifications}

    def answered_or_refused() -> bool:
        refused = any(notification.identity not in shown_before for notification in app._notifications)
        return len(app.service.figures.ttft_ms) > answered or refused

    await pilot.press("enter")
    await wait_until(pilot, answered_or_refused)
    await wait_idle(pilot, app)


def views(app: ChatApp) -> list[MessageView]:
    return app.main_screen.query_one(ChatLog).views


def answers(app: ChatApp) -> list[MessageView]:
    return [view for view in views(app) if view.role == "assistant"]


def footnote(view: MessageView) -> str:
    return str(view.query_one(".footnote").render())


def notifications(app: ChatApp) -> list[str]:
    return [notification.message for notification in app._notifications]
