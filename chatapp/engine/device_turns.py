"""One engine at a time on an offload device: the process-wide turn its engine threads take.

llama.cpp's Vulkan backend is not safe with several contexts used from several threads at
once (llama.cpp issues #7575 and #11371). Two engines on one device (`chatapp serve` with
two models loaded, the cache tests' cached and cold engines) therefore take turns: an
engine's thread holds the device while it loads, for each scheduler step and while it closes,
in a build with a device, whether or not its layers are there (llama.cpp runs a large batch's
products on the device anyway). In a CPU build engines never wait for it. Turns go in the
order they were asked for, so an engine that steps in a loop cannot starve another.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import AbstractContextManager

from chatapp.engine.llama_native import offload_device


class FairLock:
    """A re-entrant lock handed to its waiters in the order they asked (threading's locks are not)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        self._waiters: deque[tuple[int, threading.Event]] = deque()

    def acquire(self) -> None:
        me = threading.get_ident()
        with self._guard:
            if self._owner == me:
                self._depth += 1
                return
            if self._owner is None:
                self._owner, self._depth = me, 1
                return
            turn = threading.Event()
            self._waiters.append((me, turn))
        try:
            turn.wait()  # release() has made this thread the owner before it set the event
        except BaseException:  # interrupted while waiting: neither keep the turn nor stay in line for it
            with self._guard:
                if self._owner == me:
                    self._hand_over()
                else:
                    self._waiters.remove((me, turn))
            raise

    def release(self) -> None:
        with self._guard:
            if self._owner != threading.get_ident():
                raise RuntimeError("released by a thread that does not hold it")
            self._depth -= 1
            if not self._depth:
                self._hand_over()

    def _hand_over(self) -> None:
        """Under the guard: the turn goes to the first waiter, or to nobody."""
        if not self._waiters:
            self._owner, self._depth = None, 0
            return
        self._owner, turn = self._waiters.popleft()
        self._depth = 1
        turn.set()

    @property
    def waiting(self) -> int:
        """How many threads wait for their turn (tests watch it)."""
        with self._guard:
            return len(self._waiters)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()


DEVICE = FairLock()


def on_a_device() -> bool:
    """Whether this llama.cpp has a device, so that every engine may use it (even one with no layers there)."""
    return offload_device() is not None


def device_turn() -> AbstractContextManager[None]:
    """What an engine thread holds around its work on the model: the device's turn in a build with a
    device, nothing in a CPU build. Enter it anew for each part of the work."""
    return DEVICE.held() if on_a_device() else contextlib.nullcontext()
