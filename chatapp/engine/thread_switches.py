"""Brisk GIL hand-offs while a model loads beside busy Python threads.

A load is mostly C, but its Python steps (opening the cache, the state-format test, llama.cpp's
progress callback once per tensor: hundreds of times) each wait for the GIL. Behind a busy thread
(a screen drawing, another model answering) each wait lasts up to the interpreter's switch
interval (5 ms): measured 7.3 s instead of 0.1 s for the bundled model's 273 tensor callbacks, and
60-75 ms before a switch's load began while the chat screen redrew. A short interval while any
load runs makes those waits short; it is restored when the last load ends (loads may overlap).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

LOAD_SWITCH_INTERVAL_S = 0.0002
_lock = threading.Lock()
_loads = 0
_interval_before = 0.0


@contextlib.contextmanager
def brisk_thread_switches() -> Iterator[None]:
    """The interpreter's switch interval shortened for the duration (nests and overlaps across threads)."""
    global _loads, _interval_before
    with _lock:
        if _loads == 0:
            _interval_before = sys.getswitchinterval()
            sys.setswitchinterval(min(_interval_before, LOAD_SWITCH_INTERVAL_S))
        _loads += 1
    try:
        yield
    finally:
        with _lock:
            _loads -= 1
            if _loads == 0:
                sys.setswitchinterval(_interval_before)
