"""Writing a sequence state for llama.cpp from pieces of full-attention KV and a checkpoint.

A restore writes one state of the prefix's size, the buffer llama.cpp then loads. Its headers,
cell metadata and the sections cut from a checkpoint (window, recurrent state) are written
first; each block's piece is then copied into its cells as it comes, in any order and on any
thread (pieces own disjoint cells). So a restore from disk reads each block into a small
scratch buffer and copies it on, instead of holding every block next to the state
(`StateAssembly`); `assemble_state` does the same from pieces already in memory.
"""

from __future__ import annotations

import itertools
import os
import struct
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from cache.state_format import (
    CELL_META,
    HEADER,
    STATE_MAGIC,
    Checkpoint,
    KVLayout,
    MemoryLayout,
    StateFormatError,
    WindowRing,
    piece_size,
    window_ring_cells,
    window_slice,
)

Payload = bytes | bytearray | memoryview | np.ndarray


class StateAssembly:
    """A state of `cells` tokens (default: all the pieces') for `dest_seq`, filled piece by piece.

    `piece_cells` are the cell counts of consecutive blocks of full-attention KV from position
    0; the last one may hold more cells than needed (only its first ones are copied). A model
    with uncuttable sections needs the `checkpoint` taken at exactly `cells` tokens. With
    `buffer`, the state is written into its memory (valid until its next use).

    `window_ring`: the cells llama.cpp's window cache holds per sequence. The window section
    then puts each cell where a cold run of the prefix has it (`window_ring_cells`); the loader
    must then remove the cells from position `cells` on (`llama_memory_seq_rm`), a placeholder
    among them. 0 writes only the window's cells, from the first cell: equal to a cold run only
    where the kernels do not depend on where cells lie.
    """

    def __init__(
        self,
        layout: MemoryLayout,
        piece_cells: Sequence[int],
        dest_seq: int,
        *,
        cells: int | None = None,
        checkpoint: bytes | memoryview | None = None,
        buffer: StateBuffer | None = None,
        window_ring: int = 0,
    ) -> None:
        available = sum(piece_cells)
        total = available if cells is None else cells
        if total <= 0 or (total > available and layout.memory.has_blocks):
            raise StateFormatError(f"cannot assemble {total} cells from pieces of {available}")
        restored = layout.memory.checkpoint_for_restore(layout, checkpoint, total)
        window: list[tuple[int, Payload]] = []
        window_positions = np.empty(0, np.int32)
        if layout.swa is not None and restored is not None:
            window, window_positions = _window_pieces(layout, restored, total, window_ring)
        used = _used_cells(piece_cells, total) if layout.base is not None else []
        size = HEADER.size
        if layout.base is not None:
            size += layout.base.section_size(total)
        if layout.swa is not None and restored is not None:
            size += layout.swa.section_size(sum(count for count, _ in window))
        if restored is not None:
            size += len(restored.recurrent)
        self.state = buffer.take(size) if buffer is not None else np.empty(size, dtype=np.uint8)  # all written
        out = self.state
        HEADER.pack_into(out.data, 0, STATE_MAGIC, dest_seq)
        offset = HEADER.size
        self._base: _SectionWriter | None = None
        if layout.base is not None:
            self._base = _SectionWriter(out, offset, layout.base, used, np.arange(total, dtype=np.int32), dest_seq)
            offset = self._base.end
        if layout.swa is not None and restored is not None:
            writer = _SectionWriter(out, offset, layout.swa, [(n, n) for n, _ in window], window_positions, dest_seq)
            for index, (_count, payload) in enumerate(window):
                writer.fill(index, payload)
            offset = writer.end
        if restored is not None and len(restored.recurrent):
            out[offset : offset + len(restored.recurrent)] = np.frombuffer(restored.recurrent, dtype=np.uint8)
            offset += len(restored.recurrent)
        if offset != size:
            raise StateFormatError(f"assembled {offset} bytes, expected {size}")
        self._filled = [False] * len(used)

    @property
    def pieces(self) -> int:
        """How many of the pieces hold cells of the state (those after are not needed)."""
        return len(self._filled)

    def fill(self, index: int, payload: Payload) -> None:
        """Copy piece `index` into its cells; thread-safe for distinct pieces. A piece not needed is ignored."""
        if index >= len(self._filled):
            return
        assert self._base is not None  # pieces are full-attention KV
        self._base.fill(index, payload)
        self._filled[index] = True

    def finish(self) -> np.ndarray:
        """The state, once every needed piece is in it."""
        missing = self._filled.count(False)
        if missing:
            raise StateFormatError(f"{missing} of {len(self._filled)} pieces were not filled in")
        return self.state


def assemble_state(
    layout: MemoryLayout,
    pieces: Sequence[tuple[int, Payload]],
    dest_seq: int,
    *,
    cells: int | None = None,
    checkpoint: bytes | memoryview | None = None,
    buffer: StateBuffer | None = None,
    window_ring: int = 0,
) -> np.ndarray:
    """A state from `pieces` ((cell count, payload) of consecutive blocks from position 0) in memory;
    the rest as `StateAssembly`. Large copies run over the cores."""
    assembly = StateAssembly(
        layout,
        [count for count, _ in pieces],
        dest_seq,
        cells=cells,
        checkpoint=checkpoint,
        buffer=buffer,
        window_ring=window_ring,
    )

    def fill(chosen: slice) -> None:
        for index in range(chosen.start, chosen.stop):
            assembly.fill(index, pieces[index][1])

    in_parallel(fill, assembly.pieces, assembly.state.nbytes)
    return assembly.finish()


def _used_cells(piece_cells: Sequence[int], total: int) -> list[tuple[int, int]]:
    """(cells to use, cells in the piece) for the pieces that hold the first `total` cells."""
    used: list[tuple[int, int]] = []
    left = total
    for n_cells in piece_cells:
        if left <= 0:
            break
        used.append((min(n_cells, left), n_cells))
        left -= n_cells
    return used


def _window_pieces(
    layout: MemoryLayout, restored: Checkpoint, total: int, window_ring: int
) -> tuple[list[tuple[int, Payload]], np.ndarray]:
    """The window section's pieces and their cells' positions, in cell order."""
    assert layout.swa is not None
    if window_ring <= 0:
        return [(restored.window_cells, restored.window)], np.arange(restored.first, total, dtype=np.int32)
    ring = window_ring_cells(layout.window, total, window_ring)
    if ring.first < restored.first:
        raise StateFormatError(f"a window from {restored.first} for a ring that needs it from {ring.first}")
    if ring.first > restored.first:  # a checkpoint may hold more than the window
        skip = ring.first - restored.first
        data = window_slice(layout.swa, restored.window_cells, restored.window, skip, total - ring.first)
        restored = Checkpoint(total - ring.first, ring.first, memoryview(data), restored.recurrent)
    return _ring_pieces(layout.swa, restored, ring), ring.positions


def _ring_pieces(layout: KVLayout, restored: Checkpoint, ring: WindowRing) -> list[tuple[int, Payload]]:
    """The pieces of a window section laid out as `ring` says: slices of the checkpoint's window cells
    (each run in position order) and zeros for the placeholders."""
    pieces: list[tuple[int, Payload]] = []
    for _start, count, source in ring.runs():
        if source < 0:  # zeros: calloc'd pages, nothing written until read
            pieces.append((count, np.zeros(piece_size(layout, count), np.uint8)))
        elif source == 0 and count == restored.window_cells:
            pieces.append((count, restored.window))
        else:
            pieces.append((count, window_slice(layout, restored.window_cells, restored.window, source, count)))
    return pieces


class _SectionWriter:
    """One KV section: its headers and cell metadata written at once, each piece's cells as it comes.

    Streams are written in order, each as its cell count then its cells. With one stream per
    sequence (kv_unified off) the cells go in the destination sequence's slot.
    """

    def __init__(
        self,
        out: np.ndarray,
        offset: int,
        layout: KVLayout,
        pieces: Sequence[tuple[int, int]],
        positions: np.ndarray,
        dest_seq: int,
    ) -> None:
        total = sum(use for use, _ in pieces)
        if positions.size != total:
            raise StateFormatError(f"{positions.size} positions for {total} cells")
        stream = dest_seq if layout.n_stream > 1 else 0
        if not 0 <= stream < layout.n_stream:
            raise StateFormatError(f"sequence {dest_seq} has no stream among {layout.n_stream}")
        self.layout = layout
        self.pieces = list(pieces)
        self.starts = [0, *itertools.accumulate(use for use, _ in pieces)]
        header = out.data
        struct.pack_into("<I", header, offset, layout.n_stream)
        offset += 4
        out[offset : offset + 4 * stream] = 0  # empty streams before ours: zero counts
        offset += 4 * stream
        struct.pack_into("<I", header, offset, total)
        offset += 4
        meta = np.empty(total, dtype=CELL_META)
        meta["pos"] = positions
        meta["n_seq_id"] = 1
        meta["seq_id"] = dest_seq
        out[offset : offset + meta.nbytes] = meta.view(np.uint8)
        offset += meta.nbytes
        struct.pack_into("<II", header, offset, int(layout.v_trans), len(layout.layers))
        offset += 8
        self.uniform = len(set(layout.layers)) == 1
        # Per layer: K as (total * k_row); V as (rows, total * element) transposed, else (1, total * v_row).
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        for layer in layout.layers:
            struct.pack_into("<iQ", header, offset, layer.k_type, layer.k_row)
            self.keys.append(out[offset + 12 : offset + 12 + total * layer.k_row])
            offset += 12 + total * layer.k_row
        for layer in layout.layers:
            if layout.v_trans:
                struct.pack_into("<iII", header, offset, layer.v_type, layer.v_element, layer.v_embd)
                width = total * layer.v_element
                self.values.append(out[offset + 12 : offset + 12 + layer.v_embd * width].reshape(layer.v_embd, width))
                offset += 12 + layer.v_embd * width
            else:
                struct.pack_into("<iQ", header, offset, layer.v_type, layer.v_row)
                self.values.append(out[offset + 12 : offset + 12 + total * layer.v_row].reshape(1, -1))
                offset += 12 + total * layer.v_row
        if self.uniform and layout.layers:
            # Every layer the same size (most models): one copy per piece for all layers at once, through
            # strided views. A restore of 2,000 tokens is ~30 pieces of ~30 layers: one copy per piece and
            # layer costs more in numpy's per-call overhead than the bytes.
            self._all_keys = _stacked(self.keys)
            self._all_values = _stacked(self.values)
        length = 4 * (layout.n_stream - stream - 1)  # zero cell counts for the streams after ours
        out[offset : offset + length] = 0
        self.end = offset + length

    def fill(self, index: int, payload: Payload) -> None:
        use, n_cells = self.pieces[index]
        if len(payload) != piece_size(self.layout, n_cells):
            raise StateFormatError(f"a piece of {n_cells} cells has {len(payload)} bytes")
        data = np.frombuffer(payload, dtype=np.uint8)
        cell = self.starts[index]
        if self.uniform and self.layout.layers:
            layer = self.layout.layers[0]
            count = len(self.layout.layers)
            k_bytes = count * n_cells * layer.k_row
            keys = data[:k_bytes].reshape(count, n_cells * layer.k_row)
            self._all_keys[:, cell * layer.k_row : (cell + use) * layer.k_row] = keys[:, : use * layer.k_row]
            v_cell = layer.v_element if self.layout.v_trans else layer.v_row
            rows = self._all_values.shape[1]
            values = data[k_bytes:].reshape(count, rows, n_cells * v_cell)
            self._all_values[:, :, cell * v_cell : (cell + use) * v_cell] = values[:, :, : use * v_cell]
            return
        read = 0
        for layer, keys in zip(self.layout.layers, self.keys, strict=True):
            keys[cell * layer.k_row : (cell + use) * layer.k_row] = data[read : read + use * layer.k_row]
            read += n_cells * layer.k_row
        for layer, values in zip(self.layout.layers, self.values, strict=True):
            v_cell = layer.v_element if self.layout.v_trans else layer.v_row
            rows = values.shape[0]
            block = data[read : read + rows * n_cells * v_cell].reshape(rows, n_cells * v_cell)
            values[:, cell * v_cell : (cell + use) * v_cell] = block[:, : use * v_cell]
            read += rows * n_cells * v_cell


def _stacked(views: list[np.ndarray]) -> np.ndarray:
    """Same-shaped views of one buffer, evenly spaced, as one writable array with the layers first."""
    first = views[0]
    step = _address(views[1]) - _address(first) if len(views) > 1 else first.nbytes
    return np.lib.stride_tricks.as_strided(
        first, shape=(len(views), *first.shape), strides=(step, *first.strides), writeable=True
    )


def _address(data: np.ndarray) -> int:
    return int(data.__array_interface__["data"][0])


class StateBuffer:
    """Memory reused by successive restores, up to `max_bytes`.

    A restore of a few thousand tokens writes tens of megabytes; in fresh memory every page
    faults on its first write, which costs more than the copy itself (measured ~100 ms against
    ~10 ms in reused memory for 2,000 tokens of the bundled model). Larger states get fresh
    memory, so an occasional huge restore does not stay resident.
    """

    def __init__(self, max_bytes: int = 512 << 20) -> None:
        self.max_bytes = max_bytes
        self._memory = np.empty(0, dtype=np.uint8)

    @property
    def capacity(self) -> int:
        """The bytes of memory kept for the next `take`."""
        return int(self._memory.size)

    def take(self, size: int) -> np.ndarray:
        """`size` bytes of memory (their contents undefined), valid until the next call."""
        if size > self.max_bytes:
            return np.empty(size, dtype=np.uint8)
        if self._memory.size < size:
            self._memory = np.empty(min(self.max_bytes, max(size, self._memory.size * 5 // 4)), dtype=np.uint8)
        return self._memory[:size]


# A copy of pieces is many short runs (a transposed V row gets 2 bytes a cell from each block), each
# with numpy's per-run cost: spread over the cores (numpy lets go of the GIL to copy).
PARALLEL_COPY_BYTES = 8 << 20  # smaller copies are not worth a thread's start
_COPY_WORKERS = max(1, min(4, os.cpu_count() or 1))
_copy_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def in_parallel(copy: Callable[[slice], None], count: int, size: int) -> None:
    """`copy(items)` over slices of `count` items, on up to _COPY_WORKERS threads when `size` is large."""
    workers = min(_COPY_WORKERS, count) if size and size >= PARALLEL_COPY_BYTES else 1
    if workers <= 1:
        copy(slice(0, count))
        return
    global _copy_pool
    with _pool_lock:
        if _copy_pool is None:
            _copy_pool = ThreadPoolExecutor(_COPY_WORKERS, thread_name_prefix="chatapp-state-copy")
        pool = _copy_pool
    bounds = [count * index // workers for index in range(workers + 1)]
    copies = [pool.submit(copy, slice(start, end)) for start, end in itertools.pairwise(bounds)]
    futures.wait(copies)  # all of them done before one's failure is raised: none still writes to the buffer
    for done in copies:
        done.result()
