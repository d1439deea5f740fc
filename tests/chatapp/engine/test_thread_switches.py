"""Loads shorten the interpreter's switch interval while any of them runs, and only then."""

from __future__ import annotations

import sys
import threading

import pytest

from chatapp.engine.thread_switches import LOAD_SWITCH_INTERVAL_S, brisk_thread_switches


def test_overlapping_loads_keep_the_short_interval_until_the_last_ends() -> None:
    before = sys.getswitchinterval()
    first_in, first_may_end = threading.Event(), threading.Event()
    seen: list[float] = []

    def first() -> None:
        with brisk_thread_switches():
            first_in.set()
            first_may_end.wait(timeout=60)
            seen.append(sys.getswitchinterval())

    worker = threading.Thread(target=first)
    worker.start()
    first_in.wait(timeout=60)
    with brisk_thread_switches(), brisk_thread_switches():  # nested as well as overlapping
        seen.append(sys.getswitchinterval())
    seen.append(sys.getswitchinterval())  # the first load still runs
    first_may_end.set()
    worker.join()
    assert seen == pytest.approx([LOAD_SWITCH_INTERVAL_S] * 3)
    assert sys.getswitchinterval() == before
