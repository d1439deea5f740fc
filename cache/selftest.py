"""Start-up check that this llama.cpp writes states in the layout `state_format` expects.

The format is internal to llama.cpp and changes between versions. Before the cache trusts
it, a real state is parsed section by section, its full-attention KV cut into pieces and
joined back with its checkpoint (it must reproduce the original bytes), the partial state
llama.cpp writes on its own must hold the same checkpoint, and the joined state is restored
into another sequence and read back (llama.cpp must accept it and hold the same bytes). Any
difference disables the RAM and disk tiers: a miss, never a wrong restore.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from cache.memory_kinds import Memory
from cache.state_assembly import assemble_state
from cache.state_format import MemoryLayout, StateFormatError, extract_piece, parse_state


def verify_layout(
    memory: Memory,
    state: np.ndarray,
    partial_state: np.ndarray | None,
    source_sequence: int,
    target_sequence: int,
    restore_and_read_back: Callable[[np.ndarray], np.ndarray | None],
) -> MemoryLayout:
    """Return the layout of `state` once parsing, split, merge and restore have been verified.

    `partial_state` is the same sequence read with the partial-only flag (None for plain KV).
    """
    parsed = parse_state(state, memory)
    cells = parsed.n_cells
    if cells < 3:
        raise StateFormatError("the self-test needs a state of at least 3 cells")
    layout = parsed.layout(memory)
    checkpoint = memory.checkpoint_of(parsed)
    if checkpoint is not None:
        if partial_state is None:
            raise StateFormatError("no partial state to compare the checkpoint with")
        if memory.checkpoint_of(parse_state(partial_state, memory, partial=True)) != checkpoint:
            raise StateFormatError("the partial state differs from the full state's uncuttable sections")
    pieces: list[tuple[int, bytes]] = []
    if parsed.base is not None:
        order, first = parsed.base.order()
        if first != 0:
            raise StateFormatError("the full-attention cells do not start at position 0")
        bounds = [0, cells // 3, cells // 3 + 1, cells]
        pieces = [
            (end - start, extract_piece(parsed.base, order, start, end)) for start, end in itertools.pairwise(bounds)
        ]
    joined = assemble_state(layout, pieces, source_sequence, cells=cells, checkpoint=checkpoint)
    if not np.array_equal(joined, state):
        raise StateFormatError("pieces joined back differ from the original state")
    moved = assemble_state(layout, pieces, target_sequence, cells=cells, checkpoint=checkpoint)
    read_back = restore_and_read_back(moved)
    if read_back is None:
        raise StateFormatError("llama.cpp refused a state assembled from pieces")
    if not np.array_equal(read_back, moved):
        raise StateFormatError("a restored state reads back differently")
    return layout
