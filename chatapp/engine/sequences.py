"""The llama.cpp context's sequences, as the engine thread knows them: one owner per sequence.

Every fact about what a sequence holds lives in its `LiveSequence`, and only there: the
tokens its KV holds (tier "device": a resident conversation is answered in place), when it
was last used, the checkpoints this session took of it, whether its first batch was short,
which request runs on it now, and which cache tier a warm-up restored its prefix from. The
methods that change what it holds keep these facts true together, so a cut or an overwrite
can never leave a stale checkpoint or tier credit behind.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from cache.keys import as_token_array, common_prefix_length
from cache.tiers import ReuseTier
from chatapp.engine.batching import on_grid
from chatapp.engine.handle import GenerationHandle

# Checkpoints this session keeps per sequence for rewinds (the newest ones).
SESSION_CHECKPOINTS = 8


class LiveSequence:
    """One sequence of the context: what its KV holds, and what the engine must remember of it."""

    def __init__(self, index: int, grid: int = 0) -> None:
        self.index = index
        # On a fixed grid of batches (batching.py): its first `exact` tokens were computed in whole
        # grid batches from position 0, as a cold run computes them; only those are reused.
        self.grid = grid
        self.exact = 0
        # Exactly the tokens its KV holds, in order. One list for its whole life: the runner
        # extends it batch by batch, so after a stop it still says what the sequence holds.
        self.tokens: list[int] = []
        self.last_used = 0
        self.checkpoints: dict[int, bytes] = {}  # position -> uncuttable state there (for rewinds)
        # Its first batch had fewer than min_rows tokens (other kernels than a cold run's): never reused.
        self.short_first_batch = False
        self.holder: GenerationHandle | None = None  # the request running on it (or waiting to be placed on it)
        # A warm-up restored its first `restored_tokens` from this tier; the next real request reusing
        # them in place reports that tier, not "device" (the user's hit really came from the cache).
        self.restored_from = ReuseTier.NONE
        self.restored_tokens = 0
        self.restored_whole = False  # from a kept whole state (ready_states.py), which no tier budget decides
        # Its window cells before this position are placeholders (zeros a restore on a device writes so
        # that the real ones sit where a cold run has them): no cut may make them a window again.
        self.window_from = 0

    def replace(self, tokens: list[int]) -> None:
        """It now holds `tokens` (a restore, or nothing): what it held before is gone with its facts.

        On a grid, restored tokens are whole grid batches: the cache keeps nothing else.
        """
        self.tokens[:] = tokens
        self.exact = on_grid(len(tokens), self.grid)
        self.checkpoints.clear()
        self.short_first_batch = False
        self.restored_from, self.restored_tokens, self.restored_whole = ReuseTier.NONE, 0, False
        self.window_from = 0

    def truncate(self, length: int) -> None:
        """It now holds its first `length` tokens: later checkpoints and credit for dropped tokens go."""
        del self.tokens[length:]
        self.exact = on_grid(min(self.exact, length), self.grid)
        for position in [position for position in self.checkpoints if position > length]:
            del self.checkpoints[position]
        self.restored_tokens = min(self.restored_tokens, length)
        if not self.restored_tokens:
            self.restored_from, self.restored_whole = ReuseTier.NONE, False
        if not length:
            self.window_from = 0

    def computed(self, start: int, end: int) -> None:
        """A prompt batch [start, end) is now in its KV (after its tokens were added)."""
        if self.grid and start == self.exact and end == start + self.grid:
            self.exact = end

    @property
    def reusable(self) -> int:
        """How many of its tokens a later prompt may reuse: all, or on a grid its whole grid batches."""
        return self.exact if self.grid else len(self.tokens)

    def keep_checkpoint(self, position: int, payload: bytes) -> None:
        self.checkpoints[position] = payload
        while len(self.checkpoints) > SESSION_CHECKPOINTS:
            del self.checkpoints[min(self.checkpoints)]

    def checkpoint_before(self, length: int) -> int | None:
        """The newest checkpoint position at or before `length`, if any."""
        positions = [position for position in self.checkpoints if position <= length]
        return max(positions) if positions else None

    def note_warm_restore(self, tier: ReuseTier, tokens: int, whole_state: bool = False) -> None:
        """A warm-up restored its first `tokens` from `tier` (a restore replaces all it held before),
        from a kept whole state or not."""
        self.restored_from, self.restored_tokens, self.restored_whole = tier, tokens, whole_state

    def whole_state_tokens(self, reused: int) -> int:
        """Of `reused` tokens in place, how many a warm-up's kept whole state gave (until `take_credit`)."""
        return min(reused, self.restored_tokens) if self.restored_whole else 0

    def take_credit(self, reused: int, tier: ReuseTier) -> ReuseTier:
        """The tier a real request reusing `reused` tokens in place reports; the credit is used up."""
        credited = self.restored_from if tier is ReuseTier.DEVICE and reused and self.restored_tokens else tier
        self.restored_from, self.restored_tokens, self.restored_whole = ReuseTier.NONE, 0, False
        return credited


class Sequences:
    """Every sequence of the context, and the choices between them (best match, least recently used)."""

    def __init__(self, count: int, grid: int = 0) -> None:
        self._all = [LiveSequence(index, grid) for index in range(count)]
        self._clock = itertools.count(1)

    def __len__(self) -> int:
        return len(self._all)

    def __getitem__(self, index: int) -> LiveSequence:
        return self._all[index]

    def __iter__(self) -> Iterator[LiveSequence]:
        return iter(self._all)

    def touch(self, index: int) -> None:
        self._all[index].last_used = next(self._clock)

    def free(self, besides: GenerationHandle | None = None) -> list[LiveSequence]:
        """The sequences no request runs on (`besides` may hold its own)."""
        return [live for live in self._all if live.holder is None or live.holder is besides]

    def best_match(self, prompt: np.ndarray, besides: GenerationHandle | None = None) -> tuple[int, int]:
        """The free sequence sharing the longest reusable prefix with `prompt`, and that length."""
        free = self._free_or_fail(besides)
        best, best_length = free[0], -1
        for live in free:
            length = min(self.match_in(live.index, prompt), live.reusable)
            if length > best_length or (length == best_length and live.last_used > best.last_used):
                best, best_length = live, length
        return best.index, max(best_length, 0)

    def match_in(self, index: int, prompt: np.ndarray) -> int:
        held = self._all[index].tokens
        return common_prefix_length(as_token_array(held), prompt) if held else 0

    def least_recently_used(self, besides: GenerationHandle | None = None) -> int:
        """An empty free sequence if there is one, else the free one unused for longest."""
        free = self._free_or_fail(besides)
        empty = next((live for live in free if not live.tokens), None)
        return (empty or min(free, key=lambda live: live.last_used)).index

    def held_by(self, handle: GenerationHandle) -> list[LiveSequence]:
        return [live for live in self._all if live.holder is handle]

    def release(self, handle: GenerationHandle) -> None:
        """The request is done: the sequences it ran on are free."""
        for live in self.held_by(handle):
            live.holder = None

    def _free_or_fail(self, besides: GenerationHandle | None) -> list[LiveSequence]:
        free = self.free(besides)
        if not free:
            raise ValueError("every sequence is busy")
        return free
