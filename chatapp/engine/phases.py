"""Where a request is in its life on the engine thread: one explicit phase instead of flags.

The scheduler decides by it who may start beside whom and who takes a step (turns.py); the
runner moves a request from one phase to the next.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    PENDING = "pending"  # taken from the queue; waits until it may start beside the running ones
    WAITING = "waiting"  # started, not yet placed: waits for its turn (another may be computing its prefix)
    PREFILLING = "prefilling"  # placed on a sequence: computing the prompt tokens it does not reuse
    DECODING = "decoding"  # streaming answer tokens
    # The caller has its result; what follows is the engine's own work, which gives way to any request.
    RECOMPUTING = "recomputing"  # computing the answer's KV again, in batches (runner.py says why)
    STORING = "storing"  # handing the sequence's new blocks to the cache
    CHECKING = "checking"  # computing a reused prompt again without the cache (cache/restore_checks.py)
    DONE = "done"

    @property
    def placed(self) -> bool:
        """Whether it runs on a sequence now (or did)."""
        return self not in (Phase.PENDING, Phase.WAITING)

    @property
    def answered(self) -> bool:
        """Whether its caller has the result: the rest is the engine's own work."""
        return self in (Phase.RECOMPUTING, Phase.STORING, Phase.CHECKING, Phase.DONE)
