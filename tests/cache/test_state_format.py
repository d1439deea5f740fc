"""Cutting states into block pieces and joining them back, on synthetic states."""

from __future__ import annotations

import itertools
import struct

import numpy as np
import pytest

from cache.state_format import (
    StateFormatError,
    assemble_state,
    cells_in_position_order,
    extract_piece,
    parse_sequence_state,
)
from tests.cache.state_factory import make_state, small_layout, sorted_by_position


def pieces_of(blob: bytes, bounds: list[int]) -> list[tuple[int, bytes]]:
    state = parse_sequence_state(blob)
    order = cells_in_position_order(state)
    return [(end - start, extract_piece(state, order, start, end)) for start, end in itertools.pairwise(bounds)]


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("sequence", [0, 1, 3])
def test_split_and_join_reproduces_the_state(v_trans: bool, sequence: int) -> None:
    layout = small_layout(v_trans, n_stream=4)
    blob, _ = make_state(layout, list(range(23)), seq_id=sequence, stream=sequence, seed=sequence)
    parsed = parse_sequence_state(blob)
    assert parsed.layout == layout
    assert parsed.n_cells == 23
    joined = assemble_state(layout, pieces_of(blob, [0, 8, 16, 17, 23]), dest_seq=sequence)
    assert joined.tobytes() == blob


@pytest.mark.parametrize("v_trans", [False, True])
def test_cells_out_of_position_order_are_sorted(v_trans: bool) -> None:
    layout = small_layout(v_trans)
    positions = [3, 0, 4, 1, 2, 6, 5]
    blob, data = make_state(layout, positions, seq_id=1, stream=1)
    joined = assemble_state(layout, pieces_of(blob, [0, 2, 7]), dest_seq=1)
    assert joined.tobytes() == sorted_by_position(layout, positions, 1, 1, data)


def test_pieces_move_to_another_sequence() -> None:
    layout = small_layout(False, n_stream=3)
    blob, _ = make_state(layout, list(range(5)), seq_id=0, stream=0)
    moved = assemble_state(layout, pieces_of(blob, [0, 5]), dest_seq=2)
    expected, _ = make_state(layout, list(range(5)), seq_id=2, stream=2)  # same seed: same bytes
    assert moved.tobytes() == expected


def test_a_piece_holds_only_its_cells() -> None:
    layout = small_layout(True)
    blob, data = make_state(layout, list(range(10)), seq_id=0, stream=0)
    ((count, piece),) = pieces_of(blob, [4, 6])
    assert count == 2
    assert len(piece) == layout.bytes_per_cell * 2
    first_layer_keys = np.frombuffer(piece[: 2 * layout.layers[0].k_row], dtype=np.uint8)
    assert np.array_equal(first_layer_keys, data["keys"][0][4:6].ravel())


def corrupt(blob: bytes, offset: int, value: bytes) -> bytes:
    return blob[:offset] + value + blob[offset + len(value) :]


@pytest.mark.parametrize(
    "damage",
    [
        lambda blob: corrupt(blob, 0, b"\x00\x00\x00\x00"),  # magic
        lambda blob: blob[:-1],  # truncated
        lambda blob: blob + b"\x00",  # trailing bytes
        lambda blob: corrupt(blob, 20, struct.pack("<I", 2)),  # a cell shared by two sequences
        lambda blob: corrupt(blob, 8, struct.pack("<I", 0)),  # no streams
    ],
)
def test_surprises_are_format_errors(damage) -> None:
    layout = small_layout(False)
    blob, _ = make_state(layout, list(range(4)), seq_id=0, stream=0)
    with pytest.raises(StateFormatError):
        parse_sequence_state(damage(blob))


def test_gaps_in_positions_and_wrong_piece_sizes_are_refused() -> None:
    layout = small_layout(False)
    blob, _ = make_state(layout, [0, 1, 3], seq_id=0, stream=0)
    with pytest.raises(StateFormatError, match="positions"):
        cells_in_position_order(parse_sequence_state(blob))
    with pytest.raises(StateFormatError, match="piece"):
        assemble_state(layout, [(2, b"\x00" * 5)], dest_seq=0)
