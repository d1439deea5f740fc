"""A request the engine thread has taken: what the scheduler and the runner share about it."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import numpy as np

from chatapp.engine.handle import GenerationHandle
from chatapp.engine.phases import Phase
from chatapp.engine.turns import TurnState


@dataclass(eq=False)
class AnswerToken:
    """An answer token waiting to be evaluated: the scheduler decodes it, alone or in one batch with
    other answers' tokens, then resumes the task, which samples from output `row`."""

    token: int
    position: int
    sequence: int
    row: int = -1  # its logits' row in the decode that evaluated it
    evaluated: bool = False  # False when resumed without it: the request was cancelled


TaskStep = AnswerToken | None  # what a task's step yields: a token to evaluate, or nothing


class Task:
    """One request on the engine thread: its phase and turn, its steps, and the job a step runs now."""

    def __init__(self, handle: GenerationHandle, *, shares_prompt: bool) -> None:
        self.handle = handle
        self.current = handle  # the job a step runs: the answer, then its recompute (cancelled alone)
        self.steps: Generator[TaskStep, None, None] = _no_steps()
        self.pending: AnswerToken | None = None  # yielded by its last step, evaluated in its next turn
        self.turn = TurnState(np.asarray(handle.request.prompt_tokens, dtype=np.int32), shares_prompt)

    @property
    def phase(self) -> Phase:
        return self.turn.phase

    @phase.setter
    def phase(self, phase: Phase) -> None:
        self.turn.phase = phase


def _no_steps() -> Generator[TaskStep, None, None]:
    yield from ()
