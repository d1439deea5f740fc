"""The cache's only contact with llama.cpp: read and write one sequence's KV state.

Callers must be on the thread that owns the context.
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np

from cache.state_format import StateFormatError

_BYTE_POINTER = ctypes.POINTER(ctypes.c_uint8)


def read_sequence_state(context_pointer: object, sequence: int) -> np.ndarray:
    """A copy of `sequence`'s state (header, cell positions, K and V of every layer)."""
    size = int(llama_cpp.llama_state_seq_get_size(context_pointer, sequence))
    buffer = np.empty(size, dtype=np.uint8)
    written = int(
        llama_cpp.llama_state_seq_get_data(context_pointer, buffer.ctypes.data_as(_BYTE_POINTER), size, sequence)
    )
    if written != size:
        raise StateFormatError(f"llama.cpp wrote {written} of {size} state bytes")
    return buffer


def write_sequence_state(context_pointer: object, sequence: int, state: np.ndarray) -> bool:
    """Replace `sequence` with `state`; False (and the sequence emptied) when llama.cpp refuses it."""
    state = np.ascontiguousarray(state, dtype=np.uint8)
    read = int(
        llama_cpp.llama_state_seq_set_data(context_pointer, state.ctypes.data_as(_BYTE_POINTER), state.size, sequence)
    )
    if read != state.size:
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(context_pointer), sequence, -1, -1)
        return False
    return True
