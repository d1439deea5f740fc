"""The workspace opens engines: a local load runs with brisk GIL hand-offs from its first step."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import pytest

from chatapp.engine.opening import start_local_engine
from chatapp.engine.thread_switches import LOAD_SWITCH_INTERVAL_S
from chatapp.errors import LoadCancelled
from chatapp.services.startup import BATCH_VERDICTS, HASH_SHARE, Workspace
from tests.conftest import local


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


def test_a_first_load_reports_the_content_hash_then_the_weights_and_stops_when_told(workspace: Workspace) -> None:
    """The first time a model file is seen it is hashed (its cache namespace): the first half of the
    progress, which Esc stops as it stops the load; once remembered, the weights take the whole bar."""
    with pytest.raises(LoadCancelled):
        workspace.open_engine(load_progress=lambda share: share < HASH_SHARE / 2)
    shares: list[float] = []
    engine = workspace.open_engine(load_progress=noting(shares))
    engine.close()
    hashed = [share for share in shares if share <= HASH_SHARE]
    assert hashed[0] < HASH_SHARE / 2, "the hash reported its way"
    assert shares == sorted(shares)
    assert shares[-1] == pytest.approx(1.0)
    again: list[float] = []
    engine = workspace.open_engine(load_progress=noting(again))
    engine.close()
    assert again[0] < HASH_SHARE / 2, "remembered: the load's own progress from the start"
    assert again == sorted(again)


def noting(shares: list[float]) -> Callable[[float], bool]:
    """A progress callback that notes each share and goes on."""

    def note(share: float) -> bool:
        shares.append(share)
        return True

    return note


def test_the_batching_verdict_is_remembered_in_the_cache_folder(workspace: Workspace) -> None:
    """Probed once per model, build, CPU and settings: the bundled model batches its answers."""
    engine = workspace.open_engine()
    try:
        assert local(engine).batching == (True, None)
    finally:
        engine.close()
    verdicts = json.loads((workspace.kv_cache_dir.parent / BATCH_VERDICTS).read_text(encoding="utf-8"))
    assert list(verdicts.values()) == [""], "one verdict: no problem"
    assert str(workspace.model_path.resolve()) in next(iter(verdicts))
