"""Cutting llama.cpp sequence states into per-block pieces, and joining pieces back.

`llama_state_seq_get_data` (llama-cpp-python 0.3.36) writes, for one sequence:

    u32 magic 0xaf143cd8, i32 seq_id, u32 n_stream,
    per stream: u32 cell_count, and when it is not 0:
        per cell: i32 pos, u32 n_seq_id (1), i32 seq_id
        u32 v_trans, u32 n_layer
        per layer K: i32 type, u64 row bytes, one row per cell
        per layer V: as K when v_trans is 0; else i32 type, u32 element bytes,
                     u32 n_embd_v_gqa, then n_embd_v_gqa rows of cell_count elements

A block's piece is its cells' K rows and V rows (or V element columns) for every layer.
Pieces of consecutive blocks, joined in position order under a fresh header, make a
state that `llama_state_seq_set_data` restores. Everything is numpy slicing into
preallocated buffers: the data moves at memory speed. Any mismatch with this layout
raises StateFormatError, which callers treat as a cache miss.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

STATE_MAGIC = 0xAF143CD8
CELL_META = np.dtype([("pos", "<i4"), ("n_seq_id", "<u4"), ("seq_id", "<i4")])


class StateFormatError(ValueError):
    """The bytes are not a sequence state in the layout this module knows."""


@dataclass(frozen=True)
class LayerLayout:
    """Sizes of one layer's K and V data per cell."""

    k_type: int
    k_row: int  # bytes of K per cell
    v_type: int
    v_row: int  # bytes of V per cell when not transposed
    v_element: int  # bytes per V element when transposed
    v_embd: int  # V elements per cell when transposed

    def v_bytes_per_cell(self, v_trans: bool) -> int:
        return self.v_element * self.v_embd if v_trans else self.v_row


@dataclass(frozen=True)
class KVLayout:
    """What every state of one context shares: streams, V orientation, per-layer sizes."""

    n_stream: int
    v_trans: bool
    layers: tuple[LayerLayout, ...]

    @property
    def bytes_per_cell(self) -> int:
        return sum(layer.k_row + layer.v_bytes_per_cell(self.v_trans) for layer in self.layers)

    def digest(self) -> bytes:
        """16 bytes naming this layout, stored with every piece so a piece never meets another layout."""
        text = repr((self.v_trans, self.layers)).encode()
        return hashlib.blake2b(text, digest_size=16).digest()


@dataclass
class SequenceState:
    """A parsed state: positions of its cells and zero-copy views of their K and V data."""

    layout: KVLayout
    positions: np.ndarray  # int32, one per cell, in cell order
    keys: list[np.ndarray]  # per layer: (cells, k_row) uint8
    values: list[np.ndarray]  # per layer: (cells, v_row) or (v_embd, cells, v_element) uint8

    @property
    def n_cells(self) -> int:
        return int(self.positions.size)


class _Reader:
    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.offset = 0

    def take(self, size: int) -> memoryview:
        end = self.offset + size
        if size < 0 or end > len(self.data):
            raise StateFormatError(f"state ends early: wanted {size} bytes at {self.offset} of {len(self.data)}")
        view = self.data[self.offset : end]
        self.offset = end
        return view

    def unpack(self, fmt: str) -> tuple[int, ...]:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def array(self, shape: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod(shape))
        return np.frombuffer(self.take(count), dtype=np.uint8).reshape(shape)


def parse_sequence_state(blob: bytes | bytearray | memoryview | np.ndarray) -> SequenceState:
    """Read a one-sequence state; raise StateFormatError on anything unexpected."""
    reader = _Reader(memoryview(blob.data if isinstance(blob, np.ndarray) else blob).cast("B"))
    magic, _seq_id, n_stream = reader.unpack("<IiI")
    if magic != STATE_MAGIC:
        raise StateFormatError(f"unknown state magic {magic:#x}")
    if not 0 < n_stream <= 4096:
        raise StateFormatError(f"implausible stream count {n_stream}")
    parsed: SequenceState | None = None
    for _stream in range(n_stream):
        (cell_count,) = reader.unpack("<I")
        if cell_count == 0:
            continue
        if parsed is not None:
            raise StateFormatError("a sequence state with cells in two streams")
        parsed = _parse_stream(reader, n_stream, cell_count)
    if reader.offset != len(reader.data):
        raise StateFormatError(f"{len(reader.data) - reader.offset} unexpected bytes after the state")
    if parsed is None:
        return SequenceState(KVLayout(n_stream, False, ()), np.empty(0, np.int32), [], [])
    return parsed


def _parse_stream(reader: _Reader, n_stream: int, cell_count: int) -> SequenceState:
    meta = np.frombuffer(reader.take(cell_count * CELL_META.itemsize), dtype=CELL_META)
    if not np.all(meta["n_seq_id"] == 1):
        raise StateFormatError("cells shared by several sequences")
    v_trans, n_layer = reader.unpack("<II")
    if v_trans not in (0, 1) or not 0 < n_layer <= 4096:
        raise StateFormatError(f"implausible v_trans {v_trans} or layer count {n_layer}")
    key_types, keys = [], []
    for _layer in range(n_layer):
        k_type, k_row = reader.unpack("<iQ")
        key_types.append((k_type, k_row))
        keys.append(reader.array((cell_count, k_row)))
    layers, values = [], []
    for k_type, k_row in key_types:
        if v_trans:
            v_type, v_element, v_embd = reader.unpack("<iII")
            values.append(reader.array((v_embd, cell_count, v_element)))
            layers.append(LayerLayout(k_type, k_row, v_type, 0, v_element, v_embd))
        else:
            v_type, v_row = reader.unpack("<iQ")
            values.append(reader.array((cell_count, v_row)))
            layers.append(LayerLayout(k_type, k_row, v_type, v_row, 0, 0))
    layout = KVLayout(n_stream, bool(v_trans), tuple(layers))
    return SequenceState(layout, meta["pos"].copy(), keys, values)


def cells_in_position_order(state: SequenceState) -> np.ndarray:
    """Cell indices sorted by position; the positions must be exactly 0..n-1."""
    order = np.argsort(state.positions, kind="stable")
    if not np.array_equal(state.positions[order], np.arange(state.n_cells, dtype=np.int32)):
        raise StateFormatError("the sequence's positions are not 0..n-1")
    return order


def extract_piece(state: SequenceState, order: np.ndarray, start: int, end: int) -> bytes:
    """The K and V data of the cells at positions [start, end), as one bytes object."""
    if not 0 <= start < end <= state.n_cells:
        raise StateFormatError(f"block {start}..{end} is outside the state's {state.n_cells} cells")
    cells = order[start:end]
    contiguous = bool(cells[-1] - cells[0] == end - start - 1 and np.all(np.diff(cells) == 1))
    first, last = int(cells[0]), int(cells[-1]) + 1
    parts: list[np.ndarray] = []
    for keys in state.keys:
        parts.append(keys[first:last] if contiguous else keys[cells])
    for values in state.values:
        if state.layout.v_trans:
            parts.append(values[:, first:last] if contiguous else values[:, cells])
        else:
            parts.append(values[first:last] if contiguous else values[cells])
    return b"".join(np.ascontiguousarray(part).data for part in parts)


def piece_size(layout: KVLayout, n_cells: int) -> int:
    return layout.bytes_per_cell * n_cells


def assemble_state(layout: KVLayout, pieces: Sequence[tuple[int, bytes | memoryview]], dest_seq: int) -> np.ndarray:
    """Join pieces (cell count, payload) of consecutive blocks from position 0 into a state."""
    total = sum(n_cells for n_cells, _ in pieces)
    if total == 0:
        raise StateFormatError("nothing to assemble")
    for n_cells, payload in pieces:
        if len(payload) != piece_size(layout, n_cells):
            raise StateFormatError(f"a piece of {n_cells} cells has {len(payload)} bytes")
    # Streams are written in order, each as its cell count then its cells. With one stream
    # per sequence (kv_unified off) the cells go in the destination sequence's slot.
    stream = dest_seq if layout.n_stream > 1 else 0
    if not 0 <= stream < layout.n_stream:
        raise StateFormatError(f"sequence {dest_seq} has no stream among {layout.n_stream}")
    size = struct.calcsize("<IiI") + 4 * layout.n_stream + total * CELL_META.itemsize + 8
    for layer in layout.layers:
        size += 12 + total * layer.k_row
        size += (12 + total * layer.v_element * layer.v_embd) if layout.v_trans else (12 + total * layer.v_row)
    out = np.empty(size, dtype=np.uint8)  # every byte is written below: no zero-fill pass
    header = out.data  # struct writes through the buffer protocol
    struct.pack_into("<IiI", header, 0, STATE_MAGIC, dest_seq, layout.n_stream)
    offset = struct.calcsize("<IiI")
    out[offset : offset + 4 * stream] = 0  # empty streams before ours: zero counts
    offset += 4 * stream
    struct.pack_into("<I", header, offset, total)
    offset += 4
    meta = np.empty(total, dtype=CELL_META)
    meta["pos"] = np.arange(total, dtype=np.int32)
    meta["n_seq_id"] = 1
    meta["seq_id"] = dest_seq
    out[offset : offset + meta.nbytes] = meta.view(np.uint8)
    offset += meta.nbytes
    struct.pack_into("<II", header, offset, int(layout.v_trans), len(layout.layers))
    offset += 8
    cursor = _PieceCursor(pieces)
    for layer in layout.layers:
        struct.pack_into("<iQ", header, offset, layer.k_type, layer.k_row)
        offset = cursor.copy_rows(out, offset + 12, layer.k_row)
    for layer in layout.layers:
        if layout.v_trans:
            struct.pack_into("<iII", header, offset, layer.v_type, layer.v_element, layer.v_embd)
            offset = cursor.copy_columns(out, offset + 12, layer.v_embd, layer.v_element, total)
        else:
            struct.pack_into("<iQ", header, offset, layer.v_type, layer.v_row)
            offset = cursor.copy_rows(out, offset + 12, layer.v_row)
    out[offset : offset + 4 * (layout.n_stream - stream - 1)] = 0  # empty streams after ours
    offset += 4 * (layout.n_stream - stream - 1)
    if offset != size:
        raise StateFormatError(f"assembled {offset} bytes, expected {size}")
    return out


class _PieceCursor:
    """Reads consecutive pieces in step: each layer's data comes next in every piece."""

    def __init__(self, pieces: Sequence[tuple[int, bytes | memoryview]]) -> None:
        self.cells = [n_cells for n_cells, _ in pieces]
        self.views = [np.frombuffer(payload, dtype=np.uint8) for _, payload in pieces]
        self.offsets = [0] * len(pieces)

    def _take(self, index: int, length: int) -> np.ndarray:
        start = self.offsets[index]
        self.offsets[index] = start + length
        return self.views[index][start : start + length]

    def copy_rows(self, out: np.ndarray, offset: int, row_bytes: int) -> int:
        """One row per cell, pieces one after another; returns the offset after them."""
        for index, n_cells in enumerate(self.cells):
            length = n_cells * row_bytes
            out[offset : offset + length] = self._take(index, length)
            offset += length
        return offset

    def copy_columns(self, out: np.ndarray, offset: int, rows: int, element: int, total: int) -> int:
        """Transposed V: each of `rows` rows holds one element per cell, pieces side by side."""
        width_total = total * element
        target = out[offset : offset + rows * width_total].reshape(rows, width_total)
        column = 0
        for index, n_cells in enumerate(self.cells):
            width = n_cells * element
            target[:, column : column + width] = self._take(index, rows * width).reshape(rows, width)
            column += width
        return offset + rows * width_total
