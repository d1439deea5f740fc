"""Reading llama.cpp sequence states by section, cutting them into pieces, and joining pieces back.

`llama_state_seq_get_data` (llama-cpp-python 0.3.36) writes u32 magic 0xaf143cd8 and i32
seq_id, then the sections of the model's memory:

    plain attention (Llama, Qwen, SmolLM2)   [KV]
    interleaved sliding window (Gemma 3)     [KV of the full-attention layers][KV of the SWA layers]
    recurrent (Mamba, RWKV)                  [R]
    hybrid (LFM2, Qwen3.5, Granite-H)        [KV][R]
    hybrid with sliding window               [KV][SWA KV][R]

A KV section: u32 n_stream; per stream u32 cell_count and, when it is not 0, per cell i32
pos, u32 n_seq_id (1), i32 seq_id, then u32 v_trans, u32 n_layer, per layer K (i32 type,
u64 row bytes, one row per cell), then per layer V (as K when v_trans is 0; else i32 type,
u32 element bytes, u32 n_embd_v_gqa and that many rows of one element per cell). An SWA
section holds only the cells not masked for the sequence's last position: its window.

An R section: u32 cell_count (1 for a sequence), i32 pos (the last position), u32 n_seq_id
(0 when one sequence is written), then the recurrent state rows of every recurrent layer.
It names no sequence, so it moves between sequences as it is; it is kept as opaque bytes.

The full-attention KV of a prefix is cut into per-block pieces (a piece is its cells' K and
V rows for every layer). What cannot be cut, the SWA window and the recurrent state, is a
*checkpoint*: the state of those sections at one position, kept whole. A prefix of c tokens
is restored from pieces covering [0, c) and, when the model has such sections, a checkpoint
at exactly c. Everything is numpy slicing into preallocated buffers. Any mismatch raises
StateFormatError, which callers treat as a cache miss. Which sections a state holds, and what
may be done with them, each memory kind answers (memory_kinds.py).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from cache.memory_kinds import Memory, MemoryKind

STATE_MAGIC = 0xAF143CD8
HEADER = struct.Struct("<Ii")  # magic, seq_id
CELL_META = np.dtype([("pos", "<i4"), ("n_seq_id", "<u4"), ("seq_id", "<i4")])
RECURRENT_HEAD = struct.Struct("<IiI")  # cell_count (1), pos, n_seq_id (0)
CHECKPOINT_HEAD = struct.Struct("<IiI")  # window cells, first window position, recurrent bytes


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
    """What every KV section of one cache shares: streams, V orientation, per-layer sizes."""

    n_stream: int
    v_trans: bool
    layers: tuple[LayerLayout, ...]

    @property
    def bytes_per_cell(self) -> int:
        return sum(layer.k_row + layer.v_bytes_per_cell(self.v_trans) for layer in self.layers)

    def section_size(self, cells: int) -> int:
        """Bytes of a section holding `cells` cells of one sequence."""
        size = 4 + 4 * self.n_stream
        if cells:
            size += cells * CELL_META.itemsize + 8 + 24 * len(self.layers) + cells * self.bytes_per_cell
        return size


@dataclass(frozen=True)
class MemoryLayout:
    """Everything the cache must know about a context's states: its memory and the section layouts."""

    memory: Memory
    base: KVLayout | None
    swa: KVLayout | None
    recurrent_size: int  # bytes of the R section (0 when none)

    @property
    def kind(self) -> MemoryKind:
        return self.memory.kind

    @property
    def window(self) -> int:
        """n_swa: tokens an SWA layer attends to (0 when none)."""
        return self.memory.window

    @property
    def bytes_per_cell(self) -> int:
        """Bytes of full-attention KV per token (what blocks store)."""
        return self.base.bytes_per_cell if self.base is not None else 0

    @property
    def window_bytes_per_cell(self) -> int:
        return self.swa.bytes_per_cell if self.swa is not None else 0

    @property
    def kv_ggml_types(self) -> tuple[int, int]:
        """The ggml types of the K and V cells (from the first KV layer; -1 each for a model without KV)."""
        sections = self.base or self.swa
        if sections is None or not sections.layers:
            return -1, -1
        return sections.layers[0].k_type, sections.layers[0].v_type

    def digest(self) -> bytes:
        """16 bytes naming this layout, stored with every entry so an entry never meets another layout."""
        return self.memory.digest(self)


def layout_digest(layout: MemoryLayout, *, legacy: bool = False) -> bytes:
    """The digest of `layout`; `legacy`: the form plain layouts had before memory kinds existed."""
    if legacy and layout.base is not None:
        return hashlib.blake2b(repr((layout.base.v_trans, layout.base.layers)).encode(), digest_size=16).digest()
    base = (layout.base.v_trans, layout.base.layers) if layout.base else None
    swa = (layout.swa.v_trans, layout.swa.layers) if layout.swa else None
    text = repr((layout.kind.value, layout.window, base, swa, layout.recurrent_size)).encode()
    return hashlib.blake2b(text, digest_size=16).digest()


@dataclass
class KVSection:
    """A parsed KV section: positions of its cells and zero-copy views of their K and V data."""

    layout: KVLayout
    positions: np.ndarray  # int32, one per cell, in cell order
    keys: list[np.ndarray]  # per layer: (cells, k_row) uint8
    values: list[np.ndarray]  # per layer: (cells, v_row) or (v_embd, cells, v_element) uint8

    @property
    def n_cells(self) -> int:
        return int(self.positions.size)

    def order(self) -> tuple[np.ndarray, int]:
        """Cell indices in position order and the first position; positions must be consecutive."""
        order = np.argsort(self.positions, kind="stable")
        first = int(self.positions[order[0]]) if self.n_cells else 0
        if not np.array_equal(self.positions[order], np.arange(first, first + self.n_cells, dtype=np.int32)):
            raise StateFormatError("the section's positions are not consecutive")
        return order, first


@dataclass
class ParsedState:
    """A sequence state by section (None or empty where the model has no such section)."""

    base: KVSection | None
    swa: KVSection | None
    recurrent: bytes

    @property
    def n_cells(self) -> int:
        """Tokens the sequence holds: its full-attention cells, or its recurrent position + 1."""
        if self.base is not None:
            return self.base.n_cells
        return recurrent_position(self.recurrent) + 1 if self.recurrent else 0

    def layout(self, memory: Memory) -> MemoryLayout:
        return MemoryLayout(
            memory,
            self.base.layout if self.base is not None else None,
            self.swa.layout if self.swa is not None else None,
            len(self.recurrent),
        )


class StateReader:
    """Reads a state's bytes in order, refusing to run past their end."""

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

    @property
    def left(self) -> int:
        return len(self.data) - self.offset


def _bytes_view(blob: bytes | bytearray | memoryview | np.ndarray) -> memoryview:
    return memoryview(blob.data if isinstance(blob, np.ndarray) else blob).cast("B")


def parse_state(
    blob: bytes | bytearray | memoryview | np.ndarray, memory: Memory, *, partial: bool = False
) -> ParsedState:
    """Read a one-sequence state of `memory`; StateFormatError on anything unexpected.

    `partial`: the state was read with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY (no full-attention section).
    """
    reader = StateReader(_bytes_view(blob))
    magic, _seq_id = reader.unpack("<Ii")
    if magic != STATE_MAGIC:
        raise StateFormatError(f"unknown state magic {magic:#x}")
    parsed = memory.read_sections(reader, partial)
    if reader.left:
        raise StateFormatError(f"{reader.left} unexpected bytes after the state")
    return parsed


def read_kv_section(reader: StateReader) -> KVSection:
    (n_stream,) = reader.unpack("<I")
    if not 0 < n_stream <= 4096:
        raise StateFormatError(f"implausible stream count {n_stream}")
    parsed: KVSection | None = None
    for _stream in range(n_stream):
        (cell_count,) = reader.unpack("<I")
        if cell_count == 0:
            continue
        if parsed is not None:
            raise StateFormatError("a sequence state with cells in two streams")
        parsed = _parse_stream(reader, n_stream, cell_count)
    if parsed is None:
        return KVSection(KVLayout(n_stream, False, ()), np.empty(0, np.int32), [], [])
    return parsed


def _parse_stream(reader: StateReader, n_stream: int, cell_count: int) -> KVSection:
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
    return KVSection(layout, meta["pos"].copy(), keys, values)


def recurrent_position(section: bytes | memoryview) -> int:
    """The last position an R section holds (-1 when it holds nothing)."""
    if len(section) < 4:
        raise StateFormatError("a recurrent section without its cell count")
    (cell_count,) = struct.unpack_from("<I", section)
    if cell_count == 0:
        return -1
    if cell_count != 1 or len(section) < RECURRENT_HEAD.size + 8:
        raise StateFormatError(f"a recurrent section with {cell_count} cells")
    _count, position, n_seq_id = RECURRENT_HEAD.unpack_from(section)
    s_trans, n_layer = struct.unpack_from("<II", section, RECURRENT_HEAD.size)
    if n_seq_id != 0 or s_trans not in (0, 1) or not 0 < n_layer <= 4096 or position < 0:
        raise StateFormatError("a recurrent section in a layout this version does not know")
    return int(position)


def extract_piece(section: KVSection, order: np.ndarray, start: int, end: int) -> bytes:
    """The K and V data of the cells at order[start:end] (positions first + start .. first + end)."""
    return b"".join(part.data for part in piece_parts(section, order, start, end))


def piece_parts(section: KVSection, order: np.ndarray, start: int, end: int) -> tuple[np.ndarray, ...]:
    """`extract_piece`'s bytes as the flat u8 arrays it joins, in order: views of the state where its cells
    are in place and its layout lets them be (K rows; V untransposed), copies elsewhere (a transposed V)."""
    if not 0 <= start < end <= section.n_cells:
        raise StateFormatError(f"cells {start}..{end} are outside the section's {section.n_cells} cells")
    cells = order[start:end]
    contiguous = bool(cells[-1] - cells[0] == end - start - 1 and np.all(np.diff(cells) == 1))
    first, last = int(cells[0]), int(cells[-1]) + 1
    parts: list[np.ndarray] = []
    for keys in section.keys:
        parts.append(keys[first:last] if contiguous else keys[cells])
    for values in section.values:
        if section.layout.v_trans:
            parts.append(values[:, first:last] if contiguous else values[:, cells])
        else:
            parts.append(values[first:last] if contiguous else values[cells])
    return tuple(np.ascontiguousarray(part).reshape(-1) for part in parts)


def piece_size(layout: KVLayout, n_cells: int) -> int:
    return layout.bytes_per_cell * n_cells


# Checkpoints: the sections that cannot be cut (SWA window, recurrent state) at one position.


def checkpoint_payload(state: ParsedState, window: int) -> bytes:
    """The uncuttable sections of `state`, in a form that restores into any sequence.

    Of a sliding-window section only the newest `window` cells are kept: no later token attends
    to older ones, and a full-size window cache (swa_full) would otherwise store the whole
    prefix a second time in every checkpoint.
    """
    window_data = b""
    cells, first = 0, 0
    if state.swa is not None and state.swa.n_cells:
        order, first = state.swa.order()
        held = state.swa.n_cells
        cells = min(held, window) if window > 0 else held
        window_data = extract_piece(state.swa, order, held - cells, held)
        first += held - cells
    return CHECKPOINT_HEAD.pack(cells, first, len(state.recurrent)) + window_data + state.recurrent


@dataclass(frozen=True)
class Checkpoint:
    """A decoded checkpoint payload: the window's cells from `first`, and the R section."""

    window_cells: int
    first: int
    window: memoryview
    recurrent: memoryview


def _decode_checkpoint(layout: MemoryLayout, payload: bytes | memoryview) -> Checkpoint:
    """Split a checkpoint payload (or a delta's tail) into its parts, checking only sizes."""
    view = memoryview(payload).cast("B")
    if len(view) < CHECKPOINT_HEAD.size:
        raise StateFormatError("a checkpoint without its head")
    cells, first, recurrent_size = CHECKPOINT_HEAD.unpack_from(view)
    window_size = layout.window_bytes_per_cell * cells
    if CHECKPOINT_HEAD.size + window_size + recurrent_size != len(view):
        raise StateFormatError("a checkpoint of the wrong size")
    if recurrent_size != layout.recurrent_size:
        raise StateFormatError("a checkpoint whose recurrent state has another size")
    window = view[CHECKPOINT_HEAD.size : CHECKPOINT_HEAD.size + window_size]
    recurrent = view[CHECKPOINT_HEAD.size + window_size :]
    return Checkpoint(cells, first, window, recurrent)


def read_checkpoint(layout: MemoryLayout, payload: bytes | memoryview, end: int) -> Checkpoint:
    """Decode a checkpoint that must hold the state of a prefix of `end` tokens."""
    checkpoint = _decode_checkpoint(layout, payload)
    layout.memory.check_checkpoint(layout, checkpoint, end)
    return checkpoint


# Deltas: a checkpoint stored as the window cells it adds to an earlier one.


def _window_arrays(layout: KVLayout, cells: int, data: memoryview) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-layer views of window data as `extract_piece` lays it out: K (cells, k_row) for each
    layer, then V (cells, v_row), or transposed (v_embd, cells * v_element)."""
    view = np.frombuffer(data, dtype=np.uint8)
    offset = 0
    keys: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for layer in layout.layers:
        size = cells * layer.k_row
        keys.append(view[offset : offset + size].reshape(cells, layer.k_row))
        offset += size
    for layer in layout.layers:
        if layout.v_trans:
            size = layer.v_embd * cells * layer.v_element
            values.append(view[offset : offset + size].reshape(layer.v_embd, cells * layer.v_element))
        else:
            size = cells * layer.v_row
            values.append(view[offset : offset + size].reshape(cells, layer.v_row))
        offset += size
    if offset != view.size:
        raise StateFormatError(f"window data of {view.size} bytes for {cells} cells")
    return keys, values


def _window_cells(
    layout: KVLayout, parts: Sequence[tuple[int, memoryview]], skip: int, stop: int | None = None
) -> bytes:
    """The cells of consecutive window parts joined, less the first `skip` cells (and those from `stop` on)."""
    split = [_window_arrays(layout, cells, data) for cells, data in parts]
    out: list[np.ndarray] = []
    for index, _layer in enumerate(layout.layers):
        out.append(np.concatenate([keys[index] for keys, _ in split], axis=0)[skip:stop])
    for index, layer in enumerate(layout.layers):
        if layout.v_trans:
            joined = np.concatenate([values[index] for _, values in split], axis=1)
            end = None if stop is None else stop * layer.v_element
            out.append(joined[:, skip * layer.v_element : end])
        else:
            out.append(np.concatenate([values[index] for _, values in split], axis=0)[skip:stop])
    return b"".join(np.ascontiguousarray(part).data for part in out)


def window_slice(layout: KVLayout, cells: int, data: bytes | memoryview, start: int, count: int) -> bytes:
    """Cells start..start+count of window data holding `cells` cells, in the same layout."""
    if not 0 <= start <= start + count <= cells:
        raise StateFormatError(f"no cells {start}..{start + count} in a window of {cells}")
    return _window_cells(layout, [(cells, memoryview(data))], start, start + count)


def checkpoint_tail(layout: MemoryLayout, payload: bytes | memoryview, end: int, cells: int) -> bytes:
    """The checkpoint at `end` less all but its newest `cells` window cells: a delta's payload,
    restored only on top of the checkpoint at `end - cells` (see `join_checkpoint`)."""
    full = read_checkpoint(layout, payload, end)
    if layout.swa is None or not 0 < cells <= full.window_cells:
        raise StateFormatError(f"no tail of {cells} cells in a window of {full.window_cells}")
    window = _window_cells(layout.swa, [(full.window_cells, full.window)], full.window_cells - cells)
    return CHECKPOINT_HEAD.pack(cells, end - cells, len(full.recurrent)) + window + bytes(full.recurrent)


def join_checkpoint(
    layout: MemoryLayout, base: bytes | memoryview, base_end: int, tail: bytes | memoryview, end: int
) -> bytes:
    """The full checkpoint at `end`: the window of the checkpoint at `base_end` followed by a
    delta's cells from `base_end` on, cut to the newest `window` cells, with the delta's
    recurrent state. Checked like any checkpoint before it is returned."""
    older = read_checkpoint(layout, base, base_end)
    newer = _decode_checkpoint(layout, tail)
    if layout.swa is None or newer.first != base_end or base_end + newer.window_cells != end:
        raise StateFormatError(f"a delta from {newer.first} does not extend a checkpoint at {base_end} to {end}")
    cells = older.window_cells + newer.window_cells
    keep = min(end, layout.window, cells)
    window = _window_cells(
        layout.swa, [(older.window_cells, older.window), (newer.window_cells, newer.window)], cells - keep
    )
    joined = CHECKPOINT_HEAD.pack(keep, end - keep, len(newer.recurrent)) + window + bytes(newer.recurrent)
    read_checkpoint(layout, joined, end)
    return joined


# Assembly.


def window_ring_cells(window: int, tokens: int, ring: int) -> WindowRing:
    """Where a cold run of `tokens` tokens leaves the cells of a window cache of `ring` cells per sequence.

    llama.cpp puts a sequence's window cells in a ring: a cold run from an empty cache writes
    position p in cell p mod `ring` (each batch in the next free cells, from cell 0 again once the
    cache is full, over cells whose tokens left the window). Attention sums over cells in cell
    order, so a restore is bit-identical to a cold run only with every cell where that run has it:
    a restore writes the window's cells there, and a masked placeholder (zeros) in every older
    cell. When the ring has wrapped, the cell the next token goes to holds the next position as a
    placeholder, which the loader removes at once: llama.cpp then starts there, as in the cold run.
    """
    if ring <= 0 or tokens <= 0 or (tokens > ring and ring <= window):
        raise StateFormatError(f"no window ring of {ring} cells for {tokens} tokens and a {window}-token window")
    first = max(0, tokens - window)
    cells = min(tokens, ring)
    index = np.arange(cells, dtype=np.int64)
    turns, head = divmod(tokens, ring)
    if tokens <= ring:
        positions = index
    else:  # the newest position in each cell; the next token's cell holds the next position
        positions = np.where(index < head, index + turns * ring, index + (turns - 1) * ring)
        positions[head] = tokens
    return WindowRing(positions.astype(np.int32), first, tokens)


@dataclass(frozen=True)
class WindowRing:
    """A restored window section's cells in cell order: positions (one placeholder past the prefix
    once the ring has wrapped) and which of them hold the window's cells."""

    positions: np.ndarray  # int32, cell order
    first: int  # the window's first position: older cells are placeholders
    tokens: int  # the prefix's length: a cell at this position is the next token's placeholder

    def runs(self) -> list[tuple[int, int, int]]:
        """(first cell, cells, window cell index or -1 for placeholders) of each run of cells."""
        real = (self.positions >= self.first) & (self.positions < self.tokens)
        edges = np.flatnonzero(np.diff(real.astype(np.int8)) != 0) + 1
        starts = np.concatenate(([0], edges))
        stops = np.concatenate((edges, [real.size]))
        out = []
        for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
            source = int(self.positions[start]) - self.first if real[start] else -1
            out.append((start, stop - start, source))
        return out
