"""Writing synthetic sequence states in llama.cpp's layout, for tests without a model.

A state is u32 magic, i32 seq_id, then the sections of the model's memory (see
cache/state_format.py): [KV] plain, [KV][SWA KV] iSWA, [R] recurrent, [KV][R] hybrid,
[KV][SWA KV][R] hybrid-iSWA. A partial state (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) is the
header and only the SWA and R sections.

`SyntheticSequence` holds random data for every position of one sequence, so the state it
writes after any number of tokens is consistent with the states after fewer tokens: the
full-attention cells of the first k tokens are the first k cells of a longer state, the
window and the recurrent state are those after token k.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
from numpy.typing import NDArray

from cache.memory_kinds import MemoryKind, memory_of
from cache.state_format import RECURRENT_HEAD, STATE_MAGIC, KVLayout, LayerLayout, MemoryLayout

F16 = 1
F32 = 0
Rows = Sequence[NDArray[np.uint8]]  # per layer, the K (or V) data of the cells

# The sections each kind's states hold, as llama.cpp writes them: the tests' own table, not the code's.
_SECTIONS = {
    MemoryKind.PLAIN: ("base",),
    MemoryKind.ISWA: ("base", "window"),
    MemoryKind.RECURRENT: ("recurrent",),
    MemoryKind.HYBRID: ("base", "recurrent"),
    MemoryKind.HYBRID_ISWA: ("base", "window", "recurrent"),
}


def has_base(kind: MemoryKind) -> bool:
    """Full-attention KV, cut into blocks."""
    return "base" in _SECTIONS[kind]


def has_window(kind: MemoryKind) -> bool:
    return "window" in _SECTIONS[kind]


def has_recurrent(kind: MemoryKind) -> bool:
    return "recurrent" in _SECTIONS[kind]


def needs_checkpoints(kind: MemoryKind) -> bool:
    """Sections that cannot be cut: a prefix restores only at a checkpoint."""
    return _SECTIONS[kind] != ("base",)


class StateData(TypedDict):
    """A synthetic state's per-layer K and V arrays, in the cells' order."""

    keys: list[NDArray[np.uint8]]
    values: list[NDArray[np.uint8]]


def small_layout(
    v_trans: bool, n_stream: int = 2, n_layer: int = 3, scale: int = 1, *, uniform: bool = False
) -> KVLayout:
    """A made-up layout; `scale` multiplies the row sizes (large pieces are stored as files).

    Layers differ in K size unless `uniform` (as in most real models: assembly then takes its
    fast path).
    """
    layers = tuple(
        LayerLayout(
            F16,
            8 * (1 if uniform else index + 1) * scale,
            F16,
            0 if v_trans else 12 * scale,
            2 if v_trans else 0,
            5 * scale if v_trans else 0,
        )
        for index in range(n_layer)
    )
    return KVLayout(n_stream, v_trans, layers)


def random_data(layout: KVLayout, cells: int, rng: np.random.Generator) -> StateData:
    keys = [rng.integers(0, 256, (cells, layer.k_row), dtype=np.uint8) for layer in layout.layers]
    if layout.v_trans:
        values = [
            rng.integers(0, 256, (layer.v_embd, cells, layer.v_element), dtype=np.uint8) for layer in layout.layers
        ]
    else:
        values = [rng.integers(0, 256, (cells, layer.v_row), dtype=np.uint8) for layer in layout.layers]
    return {"keys": keys, "values": values}


def select(layout: KVLayout, data: StateData, cells: Sequence[int] | NDArray[np.intp]) -> StateData:
    """The data of the given cells (indices into `data`), in that order."""
    index = np.asarray(cells, dtype=np.intp)
    keys = [key[index] for key in data["keys"]]
    values = [value[:, index] if layout.v_trans else value[index] for value in data["values"]]
    return {"keys": keys, "values": values}


def make_state(
    layout: KVLayout, positions: list[int], seq_id: int, stream: int, seed: int = 0
) -> tuple[bytes, StateData]:
    """A plain state whose cells (in the given order) hold random bytes; returns it and the per-cell data."""
    data = random_data(layout, len(positions), np.random.default_rng(seed))
    blob = write_state(layout, positions, seq_id, stream, data["keys"], data["values"])
    return blob, data


def header(seq_id: int) -> bytes:
    return struct.pack("<Ii", STATE_MAGIC, seq_id)


def write_state(layout: KVLayout, positions: list[int], seq_id: int, stream: int, keys: Rows, values: Rows) -> bytes:
    """A plain state: the header and one KV section."""
    return header(seq_id) + kv_section(layout, positions, seq_id, stream, keys, values)


def kv_section(layout: KVLayout, positions: Sequence[int], seq_id: int, stream: int, keys: Rows, values: Rows) -> bytes:
    """A KV section with the sequence's cells (positions in the given order) in stream `stream`."""
    out = bytearray(struct.pack("<I", layout.n_stream))
    for index in range(layout.n_stream):
        if index != stream or not positions:
            out += struct.pack("<I", 0)
            continue
        out += struct.pack("<I", len(positions))
        for position in positions:
            out += struct.pack("<iIi", position, 1, seq_id)
        out += struct.pack("<II", int(layout.v_trans), len(layout.layers))
        for layer, key in zip(layout.layers, keys, strict=True):
            out += struct.pack("<iQ", layer.k_type, layer.k_row) + key.tobytes()
        for layer, value in zip(layout.layers, values, strict=True):
            if layout.v_trans:
                out += struct.pack("<iII", layer.v_type, layer.v_element, layer.v_embd) + value.tobytes()
            else:
                out += struct.pack("<iQ", layer.v_type, layer.v_row) + value.tobytes()
    return bytes(out)


def sorted_by_position(layout: KVLayout, positions: list[int], seq_id: int, stream: int, data: StateData) -> bytes:
    """The same state with its cells in position order."""
    order = np.argsort(positions, kind="stable")
    ordered = select(layout, data, order)
    return write_state(layout, sorted(positions), seq_id, stream, ordered["keys"], ordered["values"])


def recurrent_section(position: int, n_layer: int, rows: bytes, *, cell_count: int = 1, n_seq_id: int = 0) -> bytes:
    """An R section: cell count, the last position, n_seq_id 0, s_trans 0, n_layer, then the rows."""
    if cell_count == 0:
        return struct.pack("<I", 0)
    return RECURRENT_HEAD.pack(cell_count, position, n_seq_id) + struct.pack("<II", 0, n_layer) + rows


@dataclass(frozen=True)
class SyntheticModel:
    """The memory of a made-up model: which sections its states have, and their sizes."""

    kind: MemoryKind
    window: int = 0
    base: KVLayout | None = None
    swa: KVLayout | None = None
    recurrent_layers: int = 0
    recurrent_rows: int = 0  # bytes of recurrent rows after the R section's head

    @property
    def recurrent_size(self) -> int:
        return RECURRENT_HEAD.size + 8 + self.recurrent_rows if has_recurrent(self.kind) else 0

    @property
    def layout(self) -> MemoryLayout:
        return MemoryLayout(memory_of(self.kind, self.window), self.base, self.swa, self.recurrent_size)


def synthetic_model(
    kind: MemoryKind,
    *,
    v_trans: bool = False,
    n_stream: int = 2,
    window: int = 3,
    scale: int = 1,
    recurrent_rows: int = 40,
) -> SyntheticModel:
    """A model of `kind`: 3 full-attention layers, 2 sliding-window layers, 2 recurrent layers, as it has them."""
    return SyntheticModel(
        kind,
        window if has_window(kind) else 0,
        small_layout(v_trans, n_stream, 3, scale) if has_base(kind) else None,
        small_layout(v_trans, n_stream, 2, scale) if has_window(kind) else None,
        2 if has_recurrent(kind) else 0,
        recurrent_rows if has_recurrent(kind) else 0,
    )


class SyntheticSequence:
    """One sequence's data at every position below `length`, and the states llama.cpp would write of it."""

    def __init__(self, model: SyntheticModel, length: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.model = model
        self.length = length
        self.seed = seed
        self.base = random_data(model.base, length, rng) if model.base is not None else None
        self.swa = random_data(model.swa, length, rng) if model.swa is not None else None
        # The recurrent rows after each token.
        self.recurrent = rng.integers(0, 256, (length, model.recurrent_rows), dtype=np.uint8)

    def window_positions(self, n: int) -> list[int]:
        """The positions an SWA section holds after n tokens: the last `window` ones."""
        return list(range(max(0, n - self.model.window), n))

    def stream_of(self, layout: KVLayout, seq_id: int) -> int:
        """The stream llama.cpp keeps a sequence in: its own without a unified cache."""
        return seq_id if layout.n_stream > 1 else 0

    def _section(
        self, layout: KVLayout, data: StateData, positions: list[int], seq_id: int, stream: int, shuffle: bool
    ) -> bytes:
        if shuffle and positions:
            order = np.random.default_rng([self.seed, len(positions), 7]).permutation(len(positions))
            positions = [positions[int(index)] for index in order]
        chosen = select(layout, data, positions)  # data is kept by position: position p is row p
        return kv_section(layout, positions, seq_id, stream, chosen["keys"], chosen["values"])

    def recurrent_section(self, n: int) -> bytes:
        if n == 0:
            return recurrent_section(0, self.model.recurrent_layers, b"", cell_count=0)
        return recurrent_section(n - 1, self.model.recurrent_layers, self.recurrent[n - 1].tobytes())

    def sections(
        self,
        n: int,
        seq_id: int,
        *,
        partial: bool,
        stream: int | None = None,
        swa_stream: int | None = None,
        shuffle: bool = False,
    ) -> bytes:
        if not 0 <= n <= self.length:
            raise ValueError(f"the sequence has {self.length} positions, not {n}")
        model = self.model
        out = b""
        if model.base is not None and self.base is not None and not partial:
            where = self.stream_of(model.base, seq_id) if stream is None else stream
            out += self._section(model.base, self.base, list(range(n)), seq_id, where, shuffle)
        if model.swa is not None and self.swa is not None:
            where = self.stream_of(model.swa, seq_id) if swa_stream is None else swa_stream
            out += self._section(model.swa, self.swa, self.window_positions(n), seq_id, where, shuffle)
        if has_recurrent(model.kind):
            out += self.recurrent_section(n)
        return out

    def state(
        self,
        n: int,
        seq_id: int = 0,
        *,
        stream: int | None = None,
        swa_stream: int | None = None,
        shuffle: bool = False,
    ) -> bytes:
        """The full state after n tokens; KV sections in the sequence's own stream unless told otherwise."""
        body = self.sections(n, seq_id, partial=False, stream=stream, swa_stream=swa_stream, shuffle=shuffle)
        return header(seq_id) + body

    def partial(self, n: int, seq_id: int = 0, *, swa_stream: int | None = None, shuffle: bool = False) -> bytes:
        """The partial state after n tokens: only the SWA and recurrent sections."""
        return header(seq_id) + self.sections(n, seq_id, partial=True, swa_stream=swa_stream, shuffle=shuffle)
