"""The cache writer's pace: behind the model's threads, and never more than a few states behind them.

llama.cpp's threads wait for each other at every step of a token, so a thread that takes a slice
of one core slows all of them. Bench W, a 931 MiB state stored while another conversation decodes
96 tokens on 2 cores: the writer at nice 10 left the decode 0.65x its idle speed, at nice 19
0.91x, and in the idle class (SCHED_IDLE, switched on only while the model computed) 0.91x too.
Nice 19 is what any user may set, and a thread cannot lower it again without privileges: the
writer runs at 19 all along. It then takes the gaps between tokens, and little else while other
programs keep the cores busy.

So that states never pile up in memory when the gaps are too few (a busy server), at most
`MAX_WAITING` states wait to be stored: the next store waits for room, and the model, idle
meanwhile, leaves the cores to the writer.
"""

from __future__ import annotations

import contextlib
import os
import threading

WRITER_NICENESS = 19
MAX_WAITING = 2  # the state being written and one more


def lower_this_thread_priority() -> None:
    """The writer's nice value, on its own thread (Linux gives each thread its own); elsewhere nothing."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICENESS)


class StoreBacklog:
    """The states handed to the writer and not yet stored, at most `limit` at a time. Thread-safe."""

    def __init__(self, limit: int = MAX_WAITING) -> None:
        self.limit = limit
        self._waiting = 0
        self._room = threading.Condition()

    @property
    def waiting(self) -> int:
        return self._waiting

    def enter(self) -> None:
        """Count one more state, once fewer than `limit` wait (blocks until then)."""
        with self._room:
            self._room.wait_for(lambda: self._waiting < self.limit)
            self._waiting += 1

    def leave(self) -> None:
        """A state is stored (or given up): room for the next."""
        with self._room:
            self._waiting -= 1
            self._room.notify_all()
