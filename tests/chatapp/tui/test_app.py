"""The app as a process: a closed terminal or a stop request closes it as Ctrl+Q does."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from cache.maintenance import read_totals
from tests.tui_support import make_app, running, send, wait_until


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no hang-up signal on Windows")
async def test_a_hang_up_closes_the_app_as_ctrl_q_does(data_dir: Path) -> None:
    app = make_app(data_dir, max_tokens=4)

    def fallback(*_: object) -> None:
        """Without the app's own handler this one takes the signal: the test fails instead of the process dying."""

    before = signal.signal(signal.SIGHUP, fallback)
    try:
        async with running(app) as pilot:
            await send(pilot, app, "Hello there.")
            os.kill(os.getpid(), signal.SIGHUP)  # the terminal's window closed
            await wait_until(pilot, lambda: app.return_code is not None, timeout=60)
        assert signal.getsignal(signal.SIGHUP) is fallback, "the handler there was before is back"
    finally:
        signal.signal(signal.SIGHUP, before)
    assert app.return_code == 128 + signal.SIGHUP, "as a shell reports a process a signal stopped"
    # The cache was closed, as on Ctrl+Q: its queued blocks written and this session's counters added to the totals.
    assert read_totals(app.workspace.kv_cache_dir).get("requests", 0) >= 1
