"""A gate that holds the engine thread at a known step of a request, for tests.

A test that must act while an answer or a warm-up runs (press Esc, switch branch, kill the
process) cannot race it: on a GPU a 200-token answer ends in well under a second, on a busy
machine a short one takes seconds. Armed on an engine, the gate holds the engine thread
right after a chosen answer token was handed out (or prompt batch evaluated) until the
test releases it or the request is cancelled. Nothing else in the app arms one; an engine
without a gate pays one attribute check per step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum

from chatapp.engine.requests import GenerationRequest

POLL_SECONDS = 0.005  # how often a held step looks at its request's cancel flag
HOLD_TIMEOUT_SECONDS = 120.0  # a test waiting for a step that never comes fails instead of hanging


class Step(StrEnum):
    """Where the engine thread checks the gate."""

    TOKEN = "token"  # after an answer token was handed to the caller
    BATCH = "batch"  # after a batch of prompt tokens was evaluated (answers and warm-ups alike)


class StepGate:
    """Hold the engine thread right after its `after`-th step of one kind, until released.

    The gate holds at most once: after it is released (or the held request is cancelled)
    every later step passes. `holding` is set while the engine thread waits in it; `reached`
    is set when it first held and stays set, so a test polling for it cannot miss it.
    """

    def __init__(self, step: Step, after: int) -> None:
        if after < 1:
            raise ValueError("a gate holds after a step: `after` counts from 1")
        self.step = step
        self.after = after
        self.passed = 0
        self.holding = threading.Event()
        self.reached_step = threading.Event()
        self._released = threading.Event()

    def release(self) -> None:
        """Let the held request (and every later one) go on."""
        self._released.set()

    def wait_until_holding(self, timeout: float = HOLD_TIMEOUT_SECONDS) -> bool:
        """Block until the engine thread is held here (for tests that are not async); False on timeout."""
        return self.reached_step.wait(timeout)

    def reached(self, step: Step, cancelled: threading.Event) -> None:
        """Engine thread: count a step; hold there when it is the chosen one."""
        if step is not self.step or self._released.is_set():
            return
        self.passed += 1
        if self.passed < self.after:
            return
        self.holding.set()
        self.reached_step.set()
        try:
            while not self._released.wait(POLL_SECONDS):
                if cancelled.is_set():
                    break
        finally:
            self._released.set()  # hold once: a cancelled request releases the gate for good
            self.holding.clear()


class ArmedGates:
    """The gates armed on one engine, each with the requests it counts (None: all)."""

    def __init__(self) -> None:
        self._armed: tuple[tuple[StepGate, Callable[[GenerationRequest], bool] | None], ...] = ()

    @contextmanager
    def holding(
        self, step: Step, after: int, where: Callable[[GenerationRequest], bool] | None = None
    ) -> Iterator[StepGate]:
        """Arm a gate for the block; leaving it releases and disarms the gate."""
        gate = StepGate(step, after)
        self._armed = (*self._armed, (gate, where))
        try:
            yield gate
        finally:
            gate.release()
            self._armed = tuple(armed for armed in self._armed if armed[0] is not gate)

    def reach(self, step: Step, request: GenerationRequest, cancelled: threading.Event) -> None:
        """Engine thread: a step of `request` was taken; an armed gate that counts it may hold here."""
        for gate, where in self._armed:
            if where is None or where(request):
                gate.reached(step, cancelled)
