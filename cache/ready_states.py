"""Whole sequence states kept as llama.cpp wrote them, ready to load again without assembly.

After an answer the engine reads its sequence's whole state to store the new blocks. For a
plain KV cache that state is also exactly what llama.cpp would load to restore that
conversation: kept here (a few of the newest, under a byte budget), a later restore of
most of it is one load and one cut, with no block assembly. llama.cpp loads a sequence's
state into any sequence (it takes the destination's stream and discards the cells' stored
sequence ids), so the bytes are kept unchanged.

Only for plain KV caches: a sliding window or a recurrent state cannot be cut after the load.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

# A ready state is loaded whole, then cut: worth it when it holds at most this much more than is reused.
MAX_LOADED_PER_REUSED = 1.5


@dataclass(frozen=True)
class ReadyState:
    tokens: np.ndarray  # the tokens whose KV the state holds, in order from position 0
    state: np.ndarray  # llama.cpp's bytes for those tokens, as read


class ReadyStates:
    """The newest whole states, least recently used dropped first past `budget_bytes`."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._states: OrderedDict[int, ReadyState] = OrderedDict()  # id of the tokens' owner -> state
        self._bytes = 0
        self._next_id = 0
        self._lock = threading.Lock()

    @property
    def bytes_used(self) -> int:
        return self._bytes

    def keep(self, tokens: np.ndarray, state: np.ndarray) -> None:
        """Keep `state`, the whole state of a sequence holding exactly `tokens`.

        A kept state whose tokens are a prefix of these is dropped: this one restores all it did.
        """
        if not tokens.size or state.nbytes > self.budget_bytes:
            return
        entry = ReadyState(tokens.copy(), state)
        with self._lock:
            for key, kept in list(self._states.items()):
                if kept.tokens.size <= tokens.size and np.array_equal(kept.tokens, tokens[: kept.tokens.size]):
                    self._drop(key)
            self._states[self._next_id] = entry
            self._next_id += 1
            self._bytes += state.nbytes
            while self._bytes > self.budget_bytes:
                self._drop(next(iter(self._states)))

    def best(self, prompt: np.ndarray, reuse: int) -> ReadyState | None:
        """A kept state whose first `reuse` tokens are the prompt's, cheap enough to load whole and cut.

        The shortest such state: it loads the fewest bytes. Call `used` when it is loaded.
        """
        if reuse <= 0:
            return None
        with self._lock:
            fitting = [
                (key, kept)
                for key, kept in self._states.items()
                if reuse <= kept.tokens.size <= reuse * MAX_LOADED_PER_REUSED
                and np.array_equal(kept.tokens[:reuse], prompt[:reuse])
            ]
            if not fitting:
                return None
            return min(fitting, key=lambda item: item[1].tokens.size)[1]

    def used(self, state: ReadyState) -> None:
        """`state` was loaded: it is the most recently used."""
        with self._lock:
            for key, kept in self._states.items():
                if kept is state:
                    self._states.move_to_end(key)
                    return

    def clear(self) -> None:
        with self._lock:
            self._states.clear()
            self._bytes = 0

    def _drop(self, key: int) -> None:
        self._bytes -= self._states.pop(key).state.nbytes
