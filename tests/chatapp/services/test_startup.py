"""The workspace opens engines: a local load runs with brisk GIL hand-offs from its first step."""

from __future__ import annotations

import sys

import pytest

from chatapp.engine.opening import start_local_engine
from chatapp.engine.thread_switches import LOAD_SWITCH_INTERVAL_S
from chatapp.services.startup import Workspace


def test_opening_an_engine_hands_the_gil_over_briskly_from_its_first_step(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From before the model's file is checked (a screen drawing meanwhile starved those steps) to the
    load's last progress report; the interval is back once the engine is open."""
    before = sys.getswitchinterval()
    at_start: list[float] = []

    def start(*args: object, **kwargs: object) -> object:
        at_start.append(sys.getswitchinterval())
        return start_local_engine(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("chatapp.services.startup.start_local_engine", start)
    during: list[float] = []

    def progress(share: float) -> bool:
        during.append(sys.getswitchinterval())
        return True

    engine = workspace.open_engine(load_progress=progress)
    try:
        assert at_start == [pytest.approx(LOAD_SWITCH_INTERVAL_S)]
        assert during
        assert all(interval == pytest.approx(LOAD_SWITCH_INTERVAL_S) for interval in during)
        assert sys.getswitchinterval() == before
    finally:
        engine.close()
