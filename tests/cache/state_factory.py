"""Writing synthetic sequence states in llama.cpp's layout, for tests without a model."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TypedDict

import numpy as np
from numpy.typing import NDArray

from cache.state_format import STATE_MAGIC, KVLayout, LayerLayout

F16 = 1


class StateData(TypedDict):
    """A synthetic state's per-layer K and V arrays, in the cells' order."""

    keys: list[NDArray[np.uint8]]
    values: list[NDArray[np.uint8]]


def small_layout(v_trans: bool, n_stream: int = 2, n_layer: int = 3, scale: int = 1) -> KVLayout:
    """A made-up layout; `scale` multiplies the row sizes (large pieces are stored as files)."""
    layers = tuple(
        LayerLayout(
            F16,
            8 * (index + 1) * scale,
            F16,
            0 if v_trans else 12 * scale,
            2 if v_trans else 0,
            5 * scale if v_trans else 0,
        )
        for index in range(n_layer)
    )
    return KVLayout(n_stream, v_trans, layers)


def make_state(
    layout: KVLayout, positions: list[int], seq_id: int, stream: int, seed: int = 0
) -> tuple[bytes, StateData]:
    """A state whose cells (in the given order) hold random bytes; returns it and the per-position data."""
    rng = np.random.default_rng(seed)
    cells = len(positions)
    keys = [rng.integers(0, 256, (cells, layer.k_row), dtype=np.uint8) for layer in layout.layers]
    if layout.v_trans:
        values = [
            rng.integers(0, 256, (layer.v_embd, cells, layer.v_element), dtype=np.uint8) for layer in layout.layers
        ]
    else:
        values = [rng.integers(0, 256, (cells, layer.v_row), dtype=np.uint8) for layer in layout.layers]
    blob = write_state(layout, positions, seq_id, stream, keys, values)
    return blob, {"keys": keys, "values": values}


def write_state(
    layout: KVLayout,
    positions: list[int],
    seq_id: int,
    stream: int,
    keys: Sequence[NDArray[np.uint8]],
    values: Sequence[NDArray[np.uint8]],
) -> bytes:
    out = bytearray(struct.pack("<IiI", STATE_MAGIC, seq_id, layout.n_stream))
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
    keys = [key[order] for key in data["keys"]]
    values = [value[:, order] if layout.v_trans else value[order] for value in data["values"]]
    return write_state(layout, sorted(positions), seq_id, stream, keys, values)
