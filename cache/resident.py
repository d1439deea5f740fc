"""Tier "device": the sequences resident in the llama.cpp context itself.

Each sequence has its own KV stream, so a conversation that is still resident is
answered in place: nothing is copied. This class only keeps the books (which tokens
each sequence holds, and when it was last used); the engine does the decoding.
"""

from __future__ import annotations

import itertools

import numpy as np

from cache.keys import as_token_array, common_prefix_length


class ResidentSequences:
    def __init__(self, n_sequences: int) -> None:
        self.tokens: list[list[int]] = [[] for _ in range(n_sequences)]
        self._last_used = [0] * n_sequences
        self._clock = itertools.count(1)

    def __len__(self) -> int:
        return len(self.tokens)

    def best_match(self, prompt: np.ndarray, busy: frozenset[int] = frozenset()) -> tuple[int, int]:
        """The sequence (not `busy`) sharing the longest prefix with `prompt`, and that length."""
        free = [sequence for sequence in range(len(self.tokens)) if sequence not in busy]
        if not free:
            raise ValueError("every sequence is busy")
        best_sequence, best_length = free[0], -1
        for sequence in free:
            held = self.tokens[sequence]
            length = common_prefix_length(as_token_array(held), prompt) if held else 0
            if length > best_length or (
                length == best_length and self._last_used[sequence] > self._last_used[best_sequence]
            ):
                best_sequence, best_length = sequence, length
        return best_sequence, max(best_length, 0)

    def best_match_in(self, sequence: int, prompt: np.ndarray) -> int:
        held = self.tokens[sequence]
        return common_prefix_length(as_token_array(held), prompt) if held else 0

    def least_recently_used(self, busy: frozenset[int] = frozenset()) -> int:
        """An empty sequence (not `busy`) if there is one, else the one unused for longest."""
        free = [sequence for sequence in range(len(self.tokens)) if sequence not in busy]
        if not free:
            raise ValueError("every sequence is busy")
        for sequence in free:
            if not self.tokens[sequence]:
                return sequence
        return min(free, key=self._last_used.__getitem__)

    def touch(self, sequence: int) -> None:
        self._last_used[sequence] = next(self._clock)

    def truncate(self, sequence: int, length: int) -> None:
        del self.tokens[sequence][length:]

    def replace(self, sequence: int, tokens: list[int]) -> None:
        self.tokens[sequence][:] = tokens  # the same list: callers may hold it as the sequence's live tokens
