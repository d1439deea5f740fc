"""Save SVG screenshots of the main screens, driven on the bundled model, for the README.

    .venv/bin/python scripts/screenshots.py            # writes assets/screenshots/*.svg

Uses a throw-away data folder, so your own conversations never appear in them.
"""

from __future__ import annotations

import asyncio
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
        app = make_app(Path(folder) / "data", max_tokens=60, threads=None, temperature=0.8)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await app.main_screen.use_persona(app.library.personas.get_by_name("Document analyst"))
            app.main_screen.attach(document)
            await wait_until(pilot, lambda: app.service.view().document is not None)
            await wait_idle(pilot, app)
            await send(pilot, app, "When was Cape Wrath lighthouse built?")
            await send(pilot, app, "Who built it?")
            await pilot.press("ctrl+r")
            await wait_until(pilot, lambda: app.main_screen.query_one(ChatLog).views[-1].version_count == 2)
            await wait_idle(pilot, app)
            app.clear_notifications()
            await pilot.pause(0.3)
            app.save_screenshot(str(OUT / "main.svg"))
            for key, name in (("f2", "personas"), ("f4", "cache"), ("f1", "help"), ("f5", "settings")):
                await pilot.press(key)
                await pilot.pause(0.6)
                app.clear_notifications()
                app.save_screenshot(str(OUT / f"{name}.svg"))
                await pilot.press("escape")
                await pilot.pause(0.2)
    print(f"wrote {', '.join(sorted(p.name for p in OUT.glob('*.svg')))} to {OUT}")


if __name__ == "__main__":
    asyncio.run(main())
