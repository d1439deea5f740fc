"""A request the engine thread has taken: what the scheduler and the runner share about it."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from chatapp.engine.handle import GenerationHandle
from chatapp.engine.phases import Phase
from chatapp.engine.turns import TurnState


class Task:
    """One request on the engine thread: its phase and turn, its steps, and the job a step runs now."""

    def __init__(self, handle: GenerationHandle, *, shares_prompt: bool) -> None:
        self.handle = handle
        self.current = handle  # the job a step runs: the answer, then its recompute (cancelled alone)
        self.steps: Iterator[None] = iter(())
        self.turn = TurnState(np.asarray(handle.request.prompt_tokens, dtype=np.int32), shares_prompt)

    @property
    def phase(self) -> Phase:
        return self.turn.phase

    @phase.setter
    def phase(self, phase: Phase) -> None:
        self.turn.phase = phase
