"""Whole sequence states kept as llama.cpp wrote them, ready to load again without assembly.

After an answer the engine reads its sequence's whole state to store the new blocks. For a
plain KV cache that state is also exactly what llama.cpp would load to restore that
conversation: kept here (a few of the newest, under a byte budget), a later restore of
most of it is one load and one cut, with no block assembly. llama.cpp loads a sequence's
state into any sequence (it takes the destination's stream and discards the cells' stored
sequence ids), so the bytes are kept unchanged.

A state larger than that budget (a long prefix of a large model: a gigabyte for 8k tokens of
an 8B model) is kept *instead of* its blocks: as one entry of the RAM tier, under RAM's budget
and eviction, while its blocks go to disk only. So it is held once, not as a state and again as
blocks; the caller reads it (`keeps_whole`) before deciding where the blocks go.

Only for plain KV caches: a sliding window or a recurrent state cannot be cut after the load.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cache.eviction import BlockPlace
from cache.keys import BlockKey, common_prefix_length
from cache.ram_tier import RamTier

# A ready state is loaded whole, then cut: worth it when it holds at most this much more than is reused.
MAX_LOADED_PER_REUSED = 1.5
WHOLE_KEY_PREFIX = b"whole-state:"  # RAM keys of whole states: never a block key (those are 16 bytes)


@dataclass(frozen=True)
class ReadyState:
    tokens: np.ndarray  # the tokens whose KV the state holds, in order from position 0
    state: np.ndarray  # llama.cpp's bytes for those tokens, as read


@dataclass(frozen=True)
class _Kept:
    tokens: np.ndarray
    state: np.ndarray | None  # None: kept by the RAM tier under `ram_key`
    ram_key: BlockKey | None = None


class ReadyStates:
    """The newest whole states up to `budget_bytes` each and in all, least recently used dropped first;
    larger ones in `ram` (when given), as its entries."""

    def __init__(self, budget_bytes: int, ram: RamTier | None = None) -> None:
        self.budget_bytes = budget_bytes
        self.ram = ram if budget_bytes > 0 else None
        self._states: OrderedDict[int, _Kept] = OrderedDict()  # id of the tokens' owner -> state
        self._bytes = 0
        self._next_id = 0
        self._lock = threading.Lock()

    @property
    def bytes_used(self) -> int:
        """Bytes of the states kept under this budget (those in RAM count there)."""
        return self._bytes

    def keeps_whole(self, nbytes: int) -> bool:
        """Whether a state of `nbytes` is kept whole in RAM in place of its blocks (larger than this budget,
        within RAM's)."""
        return self.ram is not None and self.budget_bytes < nbytes <= self.ram.budget_bytes

    def keep(self, tokens: np.ndarray, state: np.ndarray) -> None:
        """Keep `state`, the whole state of a sequence holding exactly `tokens`.

        A kept state whose tokens are a prefix of these is dropped: this one restores all it did.
        """
        if not tokens.size:
            return
        in_ram = self.keeps_whole(state.nbytes)
        if state.nbytes > self.budget_bytes and not in_ram:
            return
        self.drop_superseded(tokens)
        with self._lock:
            key = self._next_id
            self._next_id += 1
            if in_ram:
                assert self.ram is not None
                ram_key = BlockKey(WHOLE_KEY_PREFIX + key.to_bytes(8, "little"))
                self._states[key] = _Kept(tokens.copy(), None, ram_key)
            else:
                self._states[key] = _Kept(tokens.copy(), state)
                self._bytes += state.nbytes
                while self._bytes > self.budget_bytes:
                    self._drop(next(iter(self._states)))
        if in_ram:
            assert self.ram is not None
            state.flags.writeable = False
            self.ram.keep(ram_key, state, place=BlockPlace(None, 0, int(tokens.size)))

    def drop_superseded(self, tokens: np.ndarray) -> None:
        """Drop the kept states whose tokens are a prefix of `tokens`: a state of `tokens` about to be read
        restores all they did (dropped first, a large one is not held twice meanwhile)."""
        with self._lock:
            for key, kept in list(self._states.items()):
                if kept.tokens.size <= tokens.size and np.array_equal(kept.tokens, tokens[: kept.tokens.size]):
                    self._drop(key)

    def best(self, prompt: np.ndarray, reuse: int) -> ReadyState | None:
        """A kept state whose first `reuse` tokens are the prompt's, cheap enough to load whole and cut.

        The shortest such state: it loads the fewest bytes. Call `used` when it is loaded.
        """
        if reuse <= 0:
            return None
        with self._lock:
            fitting = sorted(
                (kept.tokens.size, key)
                for key, kept in self._states.items()
                if reuse <= kept.tokens.size <= reuse * MAX_LOADED_PER_REUSED
                and np.array_equal(kept.tokens[:reuse], prompt[:reuse])
            )
            candidates = [(key, self._states[key]) for _size, key in fitting]
        for key, kept in candidates:
            state = kept.state if kept.ram_key is None else self._from_ram(key, kept)
            if state is not None:
                return ReadyState(kept.tokens, state)
        return None

    def _from_ram(self, key: int, kept: _Kept) -> np.ndarray | None:
        assert self.ram is not None
        assert kept.ram_key is not None
        state = self.ram.get(kept.ram_key)
        if state is None:  # evicted or expired there: forgotten here
            with self._lock:
                self._states.pop(key, None)
            return None
        assert isinstance(state, np.ndarray)
        return state

    def used(self, state: ReadyState) -> None:
        """`state` was loaded: it is the most recently used."""
        with self._lock:
            for key, kept in self._states.items():
                if kept.tokens is state.tokens:
                    self._states.move_to_end(key)
                    return

    def kept_tokens(self) -> list[np.ndarray]:
        """The tokens of each kept state, least recently used first (what a deletion must not leave behind)."""
        with self._lock:
            return [kept.tokens for kept in self._states.values()]

    def forget(self, prompts: Sequence[np.ndarray], keep: Sequence[np.ndarray] = ()) -> int:
        """Drop the kept states that hold tokens of `prompts` no prompt of `keep` shares (a state that goes
        further along one of `prompts` than along any of `keep` holds deleted text); how many went. The
        cache's `forget` drops its entries by the same two lists."""
        with self._lock:
            going = [
                key
                for key, kept in self._states.items()
                if max((common_prefix_length(kept.tokens, prompt) for prompt in prompts), default=0)
                > max((common_prefix_length(kept.tokens, prompt) for prompt in keep), default=0)
            ]
            for key in going:
                self._drop(key)
        return len(going)

    def clear(self) -> None:
        with self._lock:
            for key in list(self._states):
                self._drop(key)

    def _drop(self, key: int) -> None:
        kept = self._states.pop(key)
        if kept.state is not None:
            self._bytes -= kept.state.nbytes
        elif self.ram is not None and kept.ram_key is not None:
            self.ram.drop(kept.ram_key)
