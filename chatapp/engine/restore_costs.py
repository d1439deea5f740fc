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
MIN_MEASURED_TOKENS = 32  # shorter batches and restores are mostly fixed overhead
WHOLE_STATE = "whole state"  # a restore path besides the tiers "ram" and "disk"


@dataclass
class RestoreCosts:
    """Smoothed milliseconds per token: of computing a prompt, and of each restore path."""

    prefill_ms_per_token: float | None = None
    restore_ms_per_token: dict[str, float] = field(default_factory=dict)
    restored: int = 0  # hits restored
    recomputed: int = 0  # hits computed instead, being faster
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def note_prefill(self, tokens: int, seconds: float) -> None:
        if tokens >= MIN_MEASURED_TOKENS and seconds > 0:
            with self._lock:
                self.prefill_ms_per_token = _smoothed(self.prefill_ms_per_token, seconds * 1000 / tokens)

    def note_restore(self, path: str, tokens: int, milliseconds: float) -> None:
        if tokens >= MIN_MEASURED_TOKENS and milliseconds > 0:
            with self._lock:
                speeds = self.restore_ms_per_token
                speeds[path] = _smoothed(speeds.get(path), milliseconds / tokens)

    def should_restore(self, path: str, tokens: int) -> bool:
        """Whether restoring `tokens` by `path` is expected to be faster than computing them (counted)."""
        with self._lock:
            restore, compute = self.restore_ms_per_token.get(path), self.prefill_ms_per_token
            faster = restore is None or compute is None or restore <= compute
            if faster:
                self.restored += 1
            else:
                self.recomputed += 1
        if not faster:
            log.info(
                "computing %d cached tokens: %.3f ms/token beats the %s restore's %.3f ms/token",
                tokens,
                compute,
                path,
                restore,
            )
        return faster

    def snapshot(self) -> dict[str, object]:
        """The figures, for the stats."""
        with self._lock:
            return {
                "prefill_ms_per_token": self.prefill_ms_per_token,
                "restore_ms_per_token": dict(self.restore_ms_per_token),
                "restored": self.restored,
                "recomputed": self.recomputed,
            }


def describe(figures: dict[str, object]) -> str:
    """One line for the cache screen, from `RestoreCosts.snapshot()`."""
    restored, recomputed = figures["restored"], figures["recomputed"]
    compute = figures["prefill_ms_per_token"]
    speeds = figures["restore_ms_per_token"]
    assert isinstance(speeds, dict)
    measured = ", ".join(f"{path} {value:.4f}" for path, value in speeds.items())
    line = f"{restored} cache hits restored, {recomputed} computed instead (measured faster)"
    if isinstance(compute, float):
        line += f"  ·  ms per token: computing {compute:.3f}" + (f"; restoring {measured}" if measured else "")
    return line


def _smoothed(previous: float | None, newest: float) -> float:
    return newest if previous is None else (1 - SMOOTHING) * previous + SMOOTHING * newest
