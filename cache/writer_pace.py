"""The cache writer's pace: behind the model's threads, and never more than a few states behind them.

llama.cpp's threads wait for each other at every step of a token, so a thread that takes a slice
of one core slows all of them. Bench W, a 931 MiB state stored while another conversation decodes
96 tokens on 2 cores: the writer at nice 10 left the decode 0.65x its idle speed, at nice 19
0.78-0.91x, and in the idle class (SCHED_IDLE, only while the model computed) 0.81-1.10x. Nice 19
is what any user may set (a thread cannot leave the idle class again without privileges): the
writer runs at 19 all along. It then takes the gaps between tokens, and little else while other
programs keep the cores busy.

So that states do not pile up in memory when the gaps are too few (a machine busy with other
work, a busy server), the states waiting for the writer, the one it writes included, hold at most
`limit_bytes` (the RAM tier's budget): past it, a newer one takes the place of the oldest that has
not begun. That one is not stored (a miss later, never a wrong restore); the newer state of a
conversation holds all its older one did.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

WRITER_NICENESS = 19
MIN_HELD_BYTES = 256 << 20  # the least the writer may hold, whatever the RAM budget
# While the model computes, the writer works at most this share of the time (it rests as long as it
# worked, after each block): nice only lends it the cores' gaps, while its copies into the state's
# blocks and into the page cache take memory bandwidth a decode needs as much (bench W).
BUSY_SHARE = 0.25


def lower_this_thread_priority() -> None:
    """The writer's nice value, on its own thread (Linux gives each thread its own); elsewhere nothing."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICENESS)


class QueuedStore:
    """A store handed to the writer: run once, unless given up before it began (its state let go at once)."""

    def __init__(self, backlog: StoreBacklog, work: Callable[[], None], nbytes: int) -> None:
        self._backlog = backlog
        self._work: Callable[[], None] | None = work
        self.nbytes = nbytes

    def __call__(self) -> None:
        """On the writer thread."""
        work = self._backlog.begin(self)
        if work is None:
            return
        try:
            work()
        finally:
            self._backlog.end(self)

    def take(self) -> Callable[[], None] | None:
        """Its work, once (None when given up)."""
        work, self._work = self._work, None
        return work

    def give_up(self) -> None:
        self._work = None


class StoreBacklog:
    """The stores the writer holds, at most `limit_bytes` of states (the one it writes included). Thread-safe."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = max(limit_bytes, MIN_HELD_BYTES)
        self.given_up = 0
        self._waiting: deque[QueuedStore] = deque()
        self._writing: QueuedStore | None = None
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        writing = self._writing.nbytes if self._writing is not None else 0
        return writing + sum(store.nbytes for store in self._waiting)

    def queued(self, work: Callable[[], None], nbytes: int) -> QueuedStore:
        """A store of a state of `nbytes` to hand to the writer; the oldest waiting ones are given up past the
        limit (never the newest)."""
        store = QueuedStore(self, work, nbytes)
        with self._lock:
            self._waiting.append(store)
            while self.held_bytes > self.limit_bytes and len(self._waiting) > 1:
                self._waiting.popleft().give_up()
                self.given_up += 1
                log.info("the cache's writer is behind: an older state is not stored (a newer one is queued)")
        return store

    def begin(self, store: QueuedStore) -> Callable[[], None] | None:
        """The writer takes `store`: its work, or None when it was given up."""
        with self._lock:
            if store in self._waiting:
                self._waiting.remove(store)
            work = store.take()
            self._writing = store if work is not None else None
            return work

    def end(self, store: QueuedStore) -> None:
        with self._lock:
            if self._writing is store:
                self._writing = None


class WriterPace:
    """How long the writer rests after a piece of work: as long as it worked while `others_computing` says
    the model computes (BUSY_SHARE), not at all when it is idle (a flush at exit writes at full speed)."""

    def __init__(self) -> None:
        self.others_computing: Callable[[], bool] = lambda: False  # the engine's, once it runs
        self.rested_s = 0.0

    def after(self, worked_s: float) -> None:
        """On the writer thread, after a piece of work that took `worked_s`."""
        if worked_s <= 0 or not self.others_computing():
            return
        rest = worked_s * (1 - BUSY_SHARE) / BUSY_SHARE
        self.rested_s += rest
        time.sleep(rest)
