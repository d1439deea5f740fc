"""Where a request's prompt goes in the context, and what of it is already computed.

Runs on the engine thread. For each request it compares the longest prefix already
resident in some sequence (tier "device": answered in place, nothing copied) with the
longest prefix the cache can restore (tiers "ram" and "disk": restored into a free or
least recently used sequence), takes the longer, and makes the sequence hold exactly
that prefix. After the answer, the sequence's new blocks are handed to the cache. Any
failure to restore is a miss that leaves the sequence empty.

Making a sequence hold a shorter prefix of what it holds is a cut. A plain KV cache cuts
anywhere. A sliding-window cache cuts only where the window before the cut is still there
(always, with a full-size window cache); the window is read back after the cut to make
sure. A recurrent state cannot be cut at all: the sequence is instead rebuilt from its own
full-attention KV up to a checkpoint this session took (the recurrent state and window at
that position) — a rewind. Where no checkpoint
is close enough, the prefix is restored from the cache or computed again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np

from cache.keys import as_token_array
from cache.llama_state import read_sequence_state, write_sequence_state
from cache.memory_kinds import Memory
from cache.prefix_cache import CachedPrefix, FetchedPrefix, PrefixCache
from cache.ready_states import ReadyState, ReadyStates
from cache.state_assembly import StateBuffer, assemble_state
from cache.state_format import MemoryLayout, StateFormatError, extract_piece, parse_state, read_checkpoint
from chatapp.engine.batching import MIN_ROWS, on_grid
from chatapp.engine.events import RestoreTimings
from chatapp.engine.handle import GenerationHandle
from chatapp.engine.llama_native import NativeContext
from chatapp.engine.restore_costs import WHOLE_STATE, RestoreCosts
from chatapp.engine.sequences import Sequences
from chatapp.vocabulary import ReuseTier

log = logging.getLogger(__name__)

# Restoring costs a copy; prefer what is resident unless the cache has clearly more.
RESTORE_MARGIN_TOKENS = 8
# With logits, the last prompt tokens are always evaluated, and never one alone: llama.cpp
# computes a one-token batch with matrix-vector kernels whose results differ from a larger
# batch's, so a re-asked prompt evaluated from its last token could answer unlike a cold run.
FRESH_TOKENS = 2


@dataclass(frozen=True)
class Placement:
    sequence: int
    reused_tokens: int
    tier: ReuseTier
    restore: RestoreTimings | None = None  # when the prefix came from the cache
    # For the cache's request log (sizing advice): what the live context held in place for this prompt (or
    # a kept whole state gave: reuse no tier budget decides), and the most the cache could have served.
    in_place: int = 0
    cache_limit: int = 0


class KVPlacer:
    def __init__(
        self,
        context: NativeContext,
        cache: PrefixCache | None,
        memory: Memory,
        layout: MemoryLayout | None,
        *,
        ready_state_bytes: int = 0,
        min_rows: int = MIN_ROWS,
        grid: int = 0,
        window_ring: int = 0,
    ) -> None:
        """`window_ring`: the cells llama.cpp's sliding-window cache holds per sequence; restored windows
        put each cell where a cold run has it (assemble_state), else only the window's cells from cell 0."""
        self.context = context
        self.cache = cache
        # The model's own memory, not the layout's: a cut is judged even when the format is not understood.
        self.memory = memory
        self.layout = layout  # None when the state format is not understood: no rewinds, no checkpoints
        # Prompts on a fixed grid of batches (batching.py): reuse only whole grid batches.
        self.grid = grid
        self.sequences = Sequences(context.shape.n_sequences, grid)
        self.window_ring = window_ring
        self._state_buffer = StateBuffer()  # restores and rewinds assemble here: llama.cpp copies it at once
        # Whole states a plain KV cache loads with no assembly (a window or recurrent state cannot be cut after).
        # Larger ones, within RAM's budget, are kept as RAM's entry instead of their blocks (one copy, not two).
        self.ready = ReadyStates(
            ready_state_bytes if memory.keeps_whole_states() else 0, cache.ram if cache is not None else None
        )
        self.costs = RestoreCosts()  # restore or compute: the engine notes its prefill speed here
        # Prompt tokens every answer computes (more with flash attention: batching.py), and those a
        # warm-up computes unless its whole prompt is resident (flash attention: a batch of its own).
        self.fresh_tokens = max(FRESH_TOKENS, min_rows)
        self.warm_up_rest = min_rows if min_rows > MIN_ROWS else 0

    @property
    def reuse_stopped(self) -> bool:
        """Whether a restore check found reused KV unlike a cold run's: every prompt is then computed in full
        until the user clears it (cache/restore_checks.py)."""
        return self.cache is not None and self.cache.checks.suspended

    @property
    def takes_checkpoints(self) -> bool:
        return self.layout is not None and self.memory.restores_at_checkpoints

    def place(
        self,
        prompt: list[int],
        sequence: int | None,
        use_cache: bool,
        *,
        need_logits: bool = True,
        holder: GenerationHandle | None = None,
    ) -> Placement:
        """Choose the sequence, restore or keep the longest known prefix, drop the rest; `holder` holds it.

        Without `need_logits` (a prefill-only warm-up) every prompt token may be reused, and a
        sequence that already holds the whole prompt is kept as it is, longer tail included.
        Sequences other requests hold are neither chosen nor cut.

        The tier reported is where the reused tokens came from since the last real request: a
        warm-up's restore into the sequence is credited to the answer that then reuses it in place.
        """
        if sequence is not None and self.sequences[sequence].holder not in (None, holder):
            raise RuntimeError(f"sequence {sequence} serves another request now")
        placement = self._place(prompt, sequence, use_cache, need_logits, holder)
        live = self.sequences[placement.sequence]
        live.holder = holder
        if need_logits:
            warmed_whole = live.whole_state_tokens(placement.reused_tokens)
            credited = live.take_credit(placement.reused_tokens, placement.tier)
            # For the request log: a kept whole state (loaded now, or by a warm-up) is reuse no tier budget
            # decides, as the live context's is; a warm-up's restore of blocks is the cache's work.
            if placement.restore is not None and placement.restore.whole_state:
                in_place = placement.reused_tokens
            else:
                in_place = placement.in_place if credited == placement.tier else warmed_whole
            return replace(placement, tier=credited, in_place=in_place)
        if placement.tier in (ReuseTier.RAM, ReuseTier.DISK):
            whole = placement.restore is not None and placement.restore.whole_state
            live.note_warm_restore(placement.tier, placement.reused_tokens, whole)
        return placement

    def _place(
        self,
        prompt: list[int],
        sequence: int | None,
        use_cache: bool,
        need_logits: bool,
        holder: GenerationHandle | None,
    ) -> Placement:
        limit = on_grid(max(0, len(prompt) - self.fresh_tokens) if need_logits else len(prompt), self.grid)
        if not use_cache or self.reuse_stopped:
            target = self.sequences.least_recently_used(holder) if sequence is None else sequence
            return replace(self._keep(target, 0, ReuseTier.NONE), cache_limit=limit)
        array = as_token_array(prompt)
        if sequence is None:
            resident_sequence, resident_length = self.sequences.best_match(array, holder)
        else:
            resident_sequence, resident_length = sequence, self.sequences.match_in(sequence, array)
        resident_length = on_grid(min(resident_length, limit, self.sequences[resident_sequence].reusable), self.grid)
        if not need_logits and resident_length == len(prompt):
            self.sequences.touch(resident_sequence)  # nothing to compute, nothing to cut
            return Placement(resident_sequence, resident_length, ReuseTier.DEVICE, None, resident_length, limit)
        if not need_logits and self.warm_up_rest:
            limit = on_grid(max(0, len(prompt) - self.warm_up_rest), self.grid)
            resident_length = min(resident_length, limit)
        keepable = self._keepable(resident_sequence, resident_length)

        def probed(placement: Placement) -> Placement:
            return replace(placement, in_place=keepable, cache_limit=limit)

        if self.cache is not None:
            looking = time.perf_counter()
            found = self.cache.lookup(array, limit)
            if on_grid(found.tokens, self.grid) != found.tokens:  # the prompt leaves it inside a grid batch
                found = self.cache.lookup(array, on_grid(found.tokens, self.grid))
            ready = self.ready.best(array, found.tokens) if found.tokens > keepable else None
            path = WHOLE_STATE if ready is not None else self.cache.slowest_tier(found).value
            if found.tokens > keepable + RESTORE_MARGIN_TOKENS and self.costs.should_restore(
                path, found.tokens, found.tokens - keepable
            ):
                target = self.sequences.least_recently_used(holder) if sequence is None else sequence
                if ready is not None:
                    loaded = self._load_ready(target, ready, found.tokens, time.perf_counter() - looking)
                    if loaded is not None:
                        return probed(self._noted(loaded, WHOLE_STATE))
                restored = self._fetch_and_restore(target, found, array, looking)
                if restored is not None and restored.reused_tokens > keepable:
                    return probed(self._noted(restored, restored.tier.value))
                if target == resident_sequence:
                    keepable = 0  # the failed restore emptied it
        if keepable > 0:
            return probed(self._keep(resident_sequence, resident_length, ReuseTier.DEVICE))
        target = self.sequences.least_recently_used(holder) if sequence is None else sequence
        return probed(self._keep(target, 0, ReuseTier.NONE))

    # Cutting and rewinding a resident sequence.
    def _keepable(self, sequence: int, length: int) -> int:
        """How much of `length` the sequence can keep in place (a cut, or a rewind to a checkpoint)."""
        held = len(self.sequences[sequence].tokens)
        if length == held or self._cuts_in_place(sequence, length):
            return length
        return self._session_checkpoint(sequence, length) or 0

    def _cuts_in_place(self, sequence: int, length: int) -> bool:
        """Whether a cut at `length` keeps every cell the next token attends to (placeholders are none)."""

        def oldest_real_cell() -> int:
            first = self.context.min_position(sequence)
            return first if first < 0 else max(first, self.sequences[sequence].window_from)

        return self.memory.cuts_in_place(length, oldest_real_cell)

    def _note_window_placeholders(self, sequence: int, length: int) -> None:
        """`sequence` was just written with `length` tokens: in a window ring the window cells before its
        checkpoint's are placeholders."""
        if self.window_ring:
            self.sequences[sequence].window_from = self.memory.restored_window_start(length)

    def _session_checkpoint(self, sequence: int, length: int) -> int | None:
        """The position of the newest checkpoint this session holds for `sequence` at or before `length`."""
        return self.sequences[sequence].checkpoint_before(length)

    def _keep(self, sequence: int, length: int, tier: ReuseTier) -> Placement:
        kept = self.cut(sequence, length)
        self.sequences.touch(sequence)
        return Placement(sequence, kept, tier if kept else ReuseTier.NONE)

    def cut(self, sequence: int, length: int) -> int:
        """Make `sequence` hold its first `length` tokens (or fewer); how many it holds after."""
        held = len(self.sequences[sequence].tokens)
        if length >= held:
            return held
        if length > 0 and not self._cuts_in_place(sequence, length):
            return self._rewind(sequence, length)
        return self._cut_in_place(sequence, length)

    def recover(self, sequence: int, length: int) -> int:
        """After a stopped decode: make `sequence` hold its first `length` tokens exactly (or fewer).

        The stopped batch's cells are dropped; a window it may have pushed out, or a recurrent
        state it updated in place, is rebuilt from a checkpoint. How many tokens it holds after.
        """
        if self.memory.updates_in_place:
            return self._rewind(sequence, length)
        return self._cut_in_place(sequence, length)

    def _cut_in_place(self, sequence: int, length: int) -> int:
        """Drop the cells from `length` on; a sliding window must then hold exactly the cells it needs, where
        a cold run of those `length` tokens has them (else it is written again there: a rewind)."""
        written = self.context.max_position(sequence) + 1  # a stopped batch's cells too
        if not self.context.remove(sequence, length, -1):
            # llama.cpp cannot cut this sequence: start over.
            self.forget(sequence)
            return 0
        self.sequences[sequence].truncate(length)
        # Placeholder cells would pass the read-back: they are judged first.
        if (
            self.memory.checks_window_after_cut
            and length > 0
            and not (
                self._cuts_in_place(sequence, length)
                and self._window_holds(sequence, length)
                and self.memory.cut_keeps_cells(written, length, self.window_ring)
            )
        ):
            return self._rewind(sequence, length)
        return length

    def _window_holds(self, sequence: int, length: int) -> bool:
        """Whether the window cells of `sequence` (just cut to `length`) are every cell the next token needs.

        A window cache smaller than the context (swa_full off) reuses cells that slid out of
        the window, not always the oldest first: the cells before a cut may have gaps. The
        window is read back and checked like a checkpoint (and kept as one).
        """
        if self.layout is None:
            return False  # not understood: when in doubt, compute again
        try:
            partial = read_sequence_state(self.context.pointer, sequence, partial=True)
            payload = self.memory.checkpoint_of(parse_state(partial, self.memory, partial=True))
            if payload is None:
                return False
            read_checkpoint(self.layout, payload, length)
        except StateFormatError as error:
            log.info("the window after a cut at %d is not whole (%s); rewinding", length, error)
            return False
        self.sequences[sequence].keep_checkpoint(length, payload)
        return True

    def _rewind(self, sequence: int, length: int) -> int:
        """Rebuild `sequence` up to its newest checkpoint at or before `length`; 0 when there is none."""
        position = self._session_checkpoint(sequence, length)
        if position is None or self.layout is None or position == 0:
            self.forget(sequence)
            return 0
        if not self.memory.updates_in_place and not self.context.remove(sequence, position, -1):
            self.forget(sequence)  # (a recurrent state cannot be cut: its cells are read whole)
            return 0
        try:
            state = parse_state(read_sequence_state(self.context.pointer, sequence), self.memory)
            pieces: list[tuple[int, bytes]] = []
            if state.base is not None:
                order, first = state.base.order()
                if first != 0:
                    raise StateFormatError("the full-attention cells do not start at position 0")
                pieces = [(position, extract_piece(state.base, order, 0, position))]
            rebuilt = assemble_state(
                self.layout,
                pieces,
                sequence,
                cells=position,
                checkpoint=self.sequences[sequence].checkpoints[position],
                buffer=self._state_buffer,
                window_ring=self.window_ring,
            )
        except StateFormatError as error:
            log.warning("cannot rewind a sequence: %s", error)
            self.forget(sequence)
            return 0
        if not self._load_assembled(sequence, rebuilt, position):
            log.warning("llama.cpp refused a rewound sequence; computing it instead")
            self.forget(sequence)
            return 0
        self.sequences[sequence].truncate(position)
        self._note_window_placeholders(sequence, position)
        return position

    def _load_assembled(self, sequence: int, state: np.ndarray, tokens: int) -> bool:
        """Load a state assemble_state wrote for `tokens` tokens, then drop the next token's placeholder
        cell of a window ring (llama.cpp then starts the next batch in that cell, as a cold run does)."""
        return write_sequence_state(self.context.pointer, sequence, state) and self.context.remove(sequence, tokens, -1)

    # Checkpoints.
    def remember_checkpoint(self, sequence: int, position: int, partial_state: np.ndarray) -> bytes | None:
        """Keep the uncuttable sections of `sequence` at `position` for rewinds; the checkpoint payload."""
        if self.layout is None or not self.takes_checkpoints:
            return None
        try:
            payload = self.memory.checkpoint_of(parse_state(partial_state, self.memory, partial=True))
            if payload is None:
                return None
            read_checkpoint(self.layout, payload, position)  # refuse what would not restore
        except StateFormatError as error:
            log.warning("cannot take a checkpoint: %s", error)
            return None
        self.sequences[sequence].keep_checkpoint(position, payload)
        return payload

    # Restoring from the cache.
    def _fetch_and_restore(
        self, sequence: int, found: CachedPrefix, prompt: np.ndarray, looking: float
    ) -> Placement | None:
        """Fetch a lookup's prefix and load it into `sequence`; `looking`: when the lookup began.

        A prefix large enough to be kept whole (ReadyStates.keeps_whole) is assembled in new memory
        from blocks read through a scratch buffer, and that state is then RAM's entry: one copy.
        """
        assert self.cache is not None
        reading = time.perf_counter()
        whole = self.ready.keeps_whole(self.cache.layout.bytes_per_cell * found.tokens)
        if whole:  # a kept state of fewer of these tokens goes before the new one is read: never both at once
            self.ready.drop_superseded(prompt[: found.tokens])
        buffer = None if whole else self._state_buffer
        fetched = self.cache.fetch(
            found, prompt, sequence, buffer=buffer, window_ring=self.window_ring, keep_blocks=not whole
        )
        if fetched is None:
            return None
        restored = self._restore(sequence, fetched, (reading - looking, time.perf_counter() - reading))
        if restored is not None and whole:
            self.ready.keep(as_token_array(fetched.prompt_tokens), fetched.state)
        return restored

    def _restore(self, sequence: int, fetched: FetchedPrefix, read: tuple[float, float]) -> Placement | None:
        """Load a fetched prefix into `sequence`; `read` is how long the lookup and fetch took (s). The fetch
        assembles the state as it reads: its time is the read's."""
        self.forget(sequence)
        loading = time.perf_counter()
        if not self._load_assembled(sequence, fetched.state, fetched.tokens):
            log.warning("llama.cpp refused a cached prefix; computing it instead")
            self.context.remove(sequence, 0, -1)
            return None
        loaded = time.perf_counter()
        lookup_s, read_s = read
        timings = RestoreTimings(lookup_s * 1000, read_s * 1000, (loaded - loading) * 1000)
        self.sequences[sequence].replace(list(fetched.prompt_tokens))
        self._note_window_placeholders(sequence, fetched.tokens)
        if fetched.checkpoint is not None and self.takes_checkpoints:
            self.sequences[sequence].keep_checkpoint(fetched.tokens, fetched.checkpoint)
        self.sequences.touch(sequence)
        reused = fetched.tokens
        if on_grid(reused, self.grid) != reused:
            # Blocks of another size than the grid's batches (a block missing at fetch time ends it there):
            # only whole grid batches are what a cold run computes.
            reused = self.cut(sequence, on_grid(reused, self.grid))
            if not reused:
                return None
        return Placement(sequence, reused, fetched.tier, timings)

    def _noted(self, placement: Placement, path: str) -> Placement:
        """A restore's speed, for the next choice between restoring and computing."""
        if placement.restore is not None:
            self.costs.note_restore(path, placement.reused_tokens, placement.restore.total_ms)
        return placement

    def _load_ready(self, sequence: int, ready: ReadyState, reuse: int, lookup_s: float) -> Placement | None:
        """Load a kept whole state into `sequence` and cut it to the `reuse` tokens the prompt shares."""
        self.forget(sequence)
        loading = time.perf_counter()
        if not write_sequence_state(self.context.pointer, sequence, ready.state):
            log.warning("llama.cpp refused a kept state; restoring from the cache instead")
            self.forget(sequence)
            return None
        self.ready.used(ready)
        self.sequences[sequence].replace(ready.tokens.tolist())
        if self._cut_in_place(sequence, reuse) != reuse:
            self.forget(sequence)
            return None
        timings = RestoreTimings(lookup_s * 1000, 0.0, (time.perf_counter() - loading) * 1000, whole_state=True)
        self.sequences.touch(sequence)
        return Placement(sequence, reuse, ReuseTier.RAM, timings)

    def forget(self, sequence: int) -> None:
        """Empty a sequence whose contents are in doubt."""
        self.context.remove(sequence, 0, -1)
        self.sequences[sequence].replace([])

    def save(self, sequence: int) -> None:
        """Hand the sequence's new blocks to the cache (reads its state; the rest is background work)."""
        live = self.sequences[sequence]
        tokens = live.tokens
        if self.cache is None or not live.reusable or not self.cache.has_new_blocks(tokens, upto=live.reusable):
            return
        # On a grid a kept state is loaded for its whole grid batches only (a load cuts the rest).
        kept = as_token_array(tokens[: live.reusable])
        self.ready.drop_superseded(kept)  # before the read: a large one is not held twice meanwhile
        state = read_sequence_state(self.context.pointer, sequence)
        self.ready.keep(kept, state)
        self.cache.store(list(tokens), state, upto=live.reusable, ram=not self.ready.keeps_whole(state.nbytes))
