"""Restore or recompute: which is faster for a cache hit, from speeds measured on this machine.

On a CPU a restore is a hundred times faster than computing the same tokens, but on a fast GPU
with a small model, computing a prefix can beat reading it from disk. The engine notes how fast
it computes prompt tokens and how fast each restore path brings them back (per token, smoothed),
and the placement asks before each restore. Until both speeds are measured, it restores.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

SMOOTHING = 0.3  # weight of the newest measurement
RETRY_EVERY = 20  # a path judged slower is still taken now and then, so its speed is measured again
# Smaller hits are always restored: either way takes milliseconds, and a choice by noisy speeds
# would make reuse depend on the machine's load.
MIN_DECIDED_TOKENS = 256
MIN_MEASURED_TOKENS = 32  # shorter batches and restores are mostly fixed overhead
WHOLE_STATE = "whole state"  # a restore path besides the tiers "ram" and "disk"


@dataclass
class RestoreCosts:
    """Smoothed milliseconds per token: of computing a prompt, and of each restore path."""

    prefill_ms_per_token: float | None = None
    restore_ms_per_token: dict[str, float] = field(default_factory=dict)
    restored: int = 0  # hits restored
    recomputed: int = 0  # hits computed instead, being faster
    _passed_over: dict[str, int] = field(default_factory=dict, repr=False)  # by path, since last taken
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def note_prefill(self, tokens: int, seconds: float) -> None:
        if tokens >= MIN_MEASURED_TOKENS and seconds > 0:
            with self._lock:
                self.prefill_ms_per_token = _smoothed(self.prefill_ms_per_token, seconds * 1000 / tokens)

    def note_restore(self, path: str, tokens: int, milliseconds: float) -> None:
        """A restore of `tokens` by `path` took `milliseconds` (counted as a hit restored)."""
        with self._lock:
            self.restored += 1
            if tokens >= MIN_MEASURED_TOKENS and milliseconds > 0:
                speeds = self.restore_ms_per_token
                speeds[path] = _smoothed(speeds.get(path), milliseconds / tokens)

    def should_restore(self, path: str, loaded: int, saved: int) -> bool:
        """Whether loading `loaded` tokens by `path` is expected to take less than computing the `saved`
        tokens the restore spares (the rest is held in place either way)."""
        with self._lock:
            restore, compute = self.restore_ms_per_token.get(path), self.prefill_ms_per_token
            if restore is None or compute is None or saved < MIN_DECIDED_TOKENS:
                faster = True
            else:
                faster = restore * loaded <= compute * saved
            passed_over = self._passed_over.get(path, 0)
            if not faster and passed_over + 1 >= RETRY_EVERY:
                faster = True  # measure it again: the first measurement may have been a cold disk
            self._passed_over[path] = 0 if faster else passed_over + 1
            if not faster:
                self.recomputed += 1
        if not faster:
            log.info(
                "computing %d cached tokens: %.3f ms/token beats the %s restore of %d tokens at %.3f ms/token",
                saved,
                compute,
                path,
                loaded,
                restore,
            )
        return faster

    def describe(self) -> str:
        """One line for the cache screen: the counts, and the speeds behind them."""
        with self._lock:
            line = f"{self.restored} restored, {self.recomputed} computed instead (measured faster)"
            if self.prefill_ms_per_token is not None:
                measured = ", ".join(f"{path} {value:.4f}" for path, value in self.restore_ms_per_token.items())
                line += f"  ·  ms per token: computing {self.prefill_ms_per_token:.3f}"
                line += f"; restoring {measured}" if measured else ""
            return line


def _smoothed(previous: float | None, newest: float) -> float:
    return newest if previous is None else (1 - SMOOTHING) * previous + SMOOTHING * newest
