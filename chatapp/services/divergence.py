"""Where a prompt left the beginning it shares with an earlier one, and the text on both sides.

A prompt reuses the cache only up to its first token that differs from what was computed
before. When that is unexpected (a timestamp or a request id in a system prompt breaks
every hit after it) the user needs to see where and why: the position, the text just
before it (shared), the text the new prompt has there and the text the earlier one had.
The last prompts are kept as token arrays, compared with numpy, so this costs well under
a millisecond per request.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

EXCERPT_TOKENS = 12
REMEMBERED_PROMPTS = 64


@dataclass(frozen=True)
class Divergence:
    """The prompt matched an earlier one for `position` tokens, then differed."""

    position: int
    before: str  # the shared text just before the position
    after: str  # what this prompt has from the position
    earlier: str  # what the earlier prompt had there
    place: str = ""  # where that is, in words: "line 3 of the system prompt", "the tools", "message 4 (user)"

    def concerns(self, reused: int) -> bool:
        """Whether this is where the prompt left the one its `reused` tokens came from.

        The log holds only this process's last prompts. Reused tokens past `position` came
        from a prompt it does not hold (stored before a restart, by another process, or
        forgotten since): where the prompt left that one is not known here, and `position`
        would point into tokens that did match. When the reused tokens are the whole shared
        beginning, `position` is where they end.
        """
        return self.position >= reused

    def describe(self) -> str:
        """One line for the log and the cache screen."""
        where = f" ({self.place})" if self.place else ""
        return (
            f"diverged from an earlier prompt at token {self.position:,}{where}: "
            f"…{self.before!r} then {self.after!r}…, "
            f"where the earlier prompt had {self.earlier!r}…"
        )


class Detokenizer(Protocol):
    def detokenize(self, tokens: list[int]) -> str: ...


class PromptLog:
    """The last prompts' tokens; `compare()` finds the earlier one sharing the longest beginning."""

    def __init__(self, vocabulary: Detokenizer | None, capacity: int = REMEMBERED_PROMPTS) -> None:
        self._vocabulary = vocabulary  # None where a server builds the prompts: nothing to compare
        self._prompts: deque[np.ndarray] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def compare(self, tokens: Sequence[int]) -> Divergence | None:
        """Remember `tokens`; the divergence from the closest earlier prompt, None if it extends one or is new.

        No tokens (a server that builds its own prompts): nothing to compare.
        """
        if not tokens or self._vocabulary is None:
            return None
        prompt = np.asarray(tokens, dtype=np.int32)
        with self._lock:
            earlier = list(self._prompts)
            self._prompts.append(prompt)
        best_length, best = 0, None
        for candidate in earlier:
            shared = _shared_length(prompt, candidate)
            if shared > best_length:
                best_length, best = shared, candidate
        if best is None or best_length >= len(best) or best_length >= len(prompt):
            return None  # nothing in common, or it goes on from the earlier prompt
        return Divergence(
            position=best_length,
            before=self._text(prompt[max(0, best_length - EXCERPT_TOKENS) : best_length]),
            after=self._text(prompt[best_length : best_length + EXCERPT_TOKENS]),
            earlier=self._text(best[best_length : best_length + EXCERPT_TOKENS]),
        )

    def _text(self, tokens: np.ndarray) -> str:
        assert self._vocabulary is not None  # compare() asked
        return self._vocabulary.detokenize([int(token) for token in tokens])


def _shared_length(a: np.ndarray, b: np.ndarray) -> int:
    """How many tokens `a` and `b` share at their beginning."""
    length = min(len(a), len(b))
    differs = np.flatnonzero(a[:length] != b[:length])
    return int(differs[0]) if differs.size else length
