"""Start-up check that this llama.cpp writes states in the layout `state_format` expects.

The format is internal to llama.cpp and changes between versions. Before the cache
trusts it, a real state is cut into pieces and joined back (it must reproduce the
original bytes), and the joined state is restored into another sequence and read back
(llama.cpp must accept it and hold the same cells). Any difference disables the RAM and
disk tiers: a miss, never a wrong restore.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from cache.state_format import (
    KVLayout,
    StateFormatError,
    assemble_state,
    cells_in_position_order,
    extract_piece,
    parse_sequence_state,
)


def verify_layout(
    state: np.ndarray,
    source_sequence: int,
    target_sequence: int,
    restore_and_read_back: Callable[[np.ndarray], np.ndarray | None],
) -> KVLayout:
    """Return the layout of `state` once split, merge and restore have been verified."""
    parsed = parse_sequence_state(state)
    cells = parsed.n_cells
    if cells < 3:
        raise StateFormatError("the self-test needs a state of at least 3 cells")
    order = cells_in_position_order(parsed)
    bounds = [0, cells // 3, cells // 3 + 1, cells]
    pieces = [(end - start, extract_piece(parsed, order, start, end)) for start, end in itertools.pairwise(bounds)]
    if not np.array_equal(assemble_state(parsed.layout, pieces, source_sequence), state):
        raise StateFormatError("pieces joined back differ from the original state")
    moved = assemble_state(parsed.layout, pieces, target_sequence)
    read_back = restore_and_read_back(moved)
    if read_back is None:
        raise StateFormatError("llama.cpp refused a state assembled from pieces")
    if not np.array_equal(read_back, moved):
        raise StateFormatError("a restored state reads back differently")
    return parsed.layout
