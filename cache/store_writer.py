"""Storing on a background thread: the engine hands over a copy of a sequence's state and goes on.

The writer slices it into blocks (and a checkpoint), hashes them and writes them through every
tier; the token stream is never held up by it. Blocks are written deepest first, as reads take
them, so that the tiers' LRU keeps a prefix's first blocks longest. The states waiting for it
hold at most RAM's budget (`writer_pace.py`), and it rests while the model computes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from cache.blocks import BlockInfo, PayloadParts, payload_checksum
from cache.entries import Entries
from cache.keys import BlockKey, as_token_array
from cache.state_format import (
    MemoryLayout,
    ParsedState,
    StateFormatError,
    checkpoint_tail,
    parse_state,
    piece_parts,
    read_checkpoint,
)
from cache.writer_pace import StoreBacklog, WriterPace, lower_this_thread_priority

log = logging.getLogger(__name__)


class StoreWriter:
    def __init__(
        self, entries: Entries, layout: MemoryLayout, block_size: int, checkpoint_min_gap: int, backlog_bytes: int
    ) -> None:
        self.entries = entries
        self.layout = layout
        self.block_size = block_size
        self.checkpoint_min_gap = checkpoint_min_gap
        self.pace = WriterPace()  # the engine tells it when the model computes
        self._backlog = StoreBacklog(backlog_bytes)
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()  # the writer's work
        self._thread = threading.Thread(target=self._write_loop, name="chatapp-cache-writer", daemon=True)
        self._thread.start()

    def has_new_blocks(self, tokens: list[int], upto: int | None = None) -> bool:
        """Whether the first `upto` of `tokens` (all by default) hold any block (or, where the model
        needs one and `upto` is all of them, a checkpoint at their end) no tier keeps: not stored yet, or
        named by the index though lost (cheap: hashes, and one query per slower tier for blocks not in RAM)."""
        array = as_token_array(tokens)
        whole = upto is None or upto >= array.size
        memory = self.layout.memory
        index = self.entries.index
        with self.entries.lock:
            blocks = index.keys_for(array if whole else array[:upto]) if memory.has_blocks else []
            keys = [key for key, _, _, _ in blocks]
            if whole and memory.restores_at_checkpoints:
                keys.append(index.checkpoint_key(array)[0])
            known = [index.get(key) for key in keys]
        indexed = [info for info in known if info is not None]
        return len(indexed) < len(known) or bool(self.entries.drop_lost(indexed))

    def has_checkpoint(self, tokens: list[int]) -> bool:
        """Whether a tier keeps a checkpoint at the end of `tokens` (a lost one is forgotten, to be stored again)."""
        with self.entries.lock:
            info = self.entries.index.get(self.entries.index.checkpoint_key(as_token_array(tokens))[0])
        return info is not None and not self.entries.drop_lost([info])

    def store(self, tokens: list[int], state: np.ndarray, upto: int | None = None, *, ram: bool = True) -> None:
        """Keep the blocks (and checkpoint) of a sequence holding `tokens`, whose full state was just read.

        With `upto`, only the blocks within its first `upto` tokens, and no checkpoint unless that is
        all of them: the rest was computed otherwise than a cold run computes it (a fixed grid's
        last, partial batch, or an answer's tokens). Without `ram` the blocks skip the first tier (the
        caller keeps the whole state in RAM instead), unless no other tier keeps anything.
        """
        array = as_token_array(tokens).copy()
        upto = array.size if upto is None else min(upto, array.size)
        # The states waiting for the writer hold at most RAM's budget (writer_pace.py): past it, the oldest go.
        self._queue.put(self._backlog.queued(partial(self._store_state, array, state, upto, ram), state.nbytes))

    def store_checkpoint(self, tokens: list[int], payload: bytes) -> None:
        """Keep a checkpoint (`checkpoint_payload` of a state read after `tokens`)."""
        self._queue.put(partial(self._store_checkpoint_payload, as_token_array(tokens).copy(), payload))

    def later(self, work: Callable[[], None]) -> None:
        """Run `work` on the writer's thread, after what is queued (a refresh of the slower tiers, say)."""
        self._queue.put(work)

    @property
    def busy(self) -> bool:
        """Whether the writer has work left (a store being written, say)."""
        return self._queue.unfinished_tasks > 0

    def flush(self) -> None:
        """Wait until everything handed over is in every tier."""
        self._queue.join()

    def stop(self) -> None:
        """Finish what is queued, then end the thread."""
        self.flush()
        self._queue.put(None)
        self._thread.join()

    def _write_loop(self) -> None:
        lower_this_thread_priority()
        while (work := self._queue.get()) is not None:
            try:
                work()
            except Exception:  # a failed save loses a cache entry, never a conversation
                log.exception("could not store KV blocks (or refresh them on disk)")
            finally:
                work = None  # the job holds the state it stored: let it go now, not when the next job comes
                self._queue.task_done()
        self._queue.task_done()

    def _store_checkpoint_payload(self, tokens: np.ndarray, payload: bytes) -> None:
        try:
            read_checkpoint(self.layout, payload, int(tokens.size))  # refuse what would not restore
        except StateFormatError as error:
            log.warning("not storing a checkpoint: %s", error)
            return
        self._store_checkpoint(tokens, payload)

    def _store_state(self, tokens: np.ndarray, data: np.ndarray, upto: int, ram: bool) -> None:
        memory = self.layout.memory
        try:
            state = parse_state(data, memory)
            if state.layout(memory) != self.layout or state.n_cells != tokens.size:
                raise StateFormatError("the state does not match its tokens or this cache's layout")
            order: np.ndarray | None = None
            if state.base is not None:
                order, first = state.base.order()
                if first != 0:
                    raise StateFormatError("the full-attention cells do not start at position 0")
            checkpoint = memory.checkpoint_of(state) if upto == tokens.size else None
            if checkpoint is not None:
                read_checkpoint(self.layout, checkpoint, int(tokens.size))
        except StateFormatError as error:
            log.warning("not storing a sequence: %s", error)
            return
        if checkpoint is not None:
            self._store_checkpoint(tokens, checkpoint)
        if order is not None:
            self._store_blocks(tokens, state, order, upto, ram or not self.entries.tiers.keeps_beyond_first)

    def _store_blocks(self, tokens: np.ndarray, state: ParsedState, order: np.ndarray, upto: int, ram: bool) -> None:
        """The blocks of `tokens[:upto]` no tier keeps, from `state` (its cells in position `order`)."""
        assert state.base is not None
        entries = self.entries
        stored: list[BlockInfo] = []
        # Deepest first, as reads go (see fetch): the tiers' LRU then keeps a prefix's first blocks longest.
        with entries.tiers.storing():  # the disk puts the blocks of this store in one file, read back in one pass
            for key, parent, start, end in reversed(self._blocks_to_store(tokens[:upto])):
                began = time.perf_counter()
                block_tokens = tokens[start:end].copy()
                if end - start < self.block_size and self._covered_by_sibling(parent, block_tokens):
                    continue  # a longer stored block already holds these tokens
                parts = PayloadParts(piece_parts(state.base, order, start, end))
                payload = parts.joined() if ram else parts  # RAM keeps bytes; the disk writes the parts as they are
                info = BlockInfo(key, parent, start, block_tokens, parts.nbytes, payload_checksum(payload))
                entries.tiers.put(info, payload, first=ram)
                stored.append(info)
                entries.added(info)
                with entries.lock:
                    superseded = [
                        sibling
                        for sibling in entries.index.children(parent)
                        if sibling.key != key
                        and sibling.tokens.size < block_tokens.size
                        and np.array_equal(sibling.tokens, block_tokens[: sibling.tokens.size])
                        and not sibling.pinned
                    ]
                for sibling in superseded:
                    entries.forget(sibling)
                self.pace.after(time.perf_counter() - began)  # indexed: a rest leaves nothing half done
        entries.recorder.log_stored(stored[::-1])

    def _blocks_to_store(self, tokens: np.ndarray) -> list[tuple[BlockKey, BlockKey, int, int]]:
        """The blocks of `tokens` no tier keeps: new ones, and lost ones (`Entries.drop_lost`)."""
        with self.entries.lock:
            keys = self.entries.index.keys_for(tokens)
            known = [self.entries.index.entries.get(entry[0]) for entry in keys]
        lost = self.entries.drop_lost([info for info in known if info is not None])
        return [entry for entry, info in zip(keys, known, strict=True) if info is None or info.key in lost]

    def _store_checkpoint(self, tokens: np.ndarray, payload: bytes) -> None:
        """Store a checkpoint (validated by the caller) at the end of `tokens`.

        One fewer than `checkpoint_min_gap` tokens after a stored checkpoint on the same
        tokens is not stored. Where a whole checkpoint on the same tokens is at most half a
        window behind, only the window cells after it are stored (a delta): consecutive
        checkpoints of one conversation share most of their windows.
        """
        entries = self.entries
        end = int(tokens.size)
        with entries.lock:
            key, anchor, anchor_position = entries.index.checkpoint_key(tokens)
            known = entries.index.get(key)
        if known is not None and not entries.drop_lost([known]):
            return
        earlier = entries.deepest_restorable(tokens, end - 1)
        if earlier is not None and end - earlier.end < self.checkpoint_min_gap:
            return
        extends = self._whole_checkpoint_to_extend(earlier, end)
        stored = payload
        if extends is not None:
            try:
                stored = checkpoint_tail(self.layout, payload, end, end - extends.end)
            except StateFormatError as error:
                log.warning("storing a whole checkpoint: %s", error)
                extends = None
        info = BlockInfo(
            key,
            anchor,
            anchor_position,
            tokens[anchor_position:].copy(),
            len(stored),
            payload_checksum(stored),
            checkpoint=True,
            extends=extends.key if extends is not None else None,
            extends_checksum=extends.checksum if extends is not None else 0,
        )
        entries.tiers.put(info, stored)
        with entries.lock:
            entries.index.add(info)
        entries.recorder.log_stored([info])

    def _whole_checkpoint_to_extend(self, earlier: BlockInfo | None, end: int) -> BlockInfo | None:
        """The whole checkpoint a checkpoint at `end` may be stored as a delta on: `earlier` (the
        deepest before it on the same tokens) or the one `earlier` extends, at most half a
        window behind. Deltas are one level deep: a restore reads at most two checkpoints."""
        if earlier is None:
            return None
        if earlier.extends is not None:
            with self.entries.lock:
                earlier = self.entries.base_of(earlier)
            if earlier is None:
                return None
        return earlier if self.layout.memory.extends_checkpoint(earlier.end, end) else None

    def _covered_by_sibling(self, parent: BlockKey, tokens: np.ndarray) -> bool:
        with self.entries.lock:
            return any(
                sibling.tokens.size >= tokens.size and np.array_equal(sibling.tokens[: tokens.size], tokens)
                for sibling in self.entries.index.children(parent)
            )
