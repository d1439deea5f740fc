"""The cache's only contact with llama.cpp: read and write one sequence's KV state.

Callers must be on the thread that owns the context.
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np

from cache.state_format import StateFormatError

_BYTE_POINTER = ctypes.POINTER(ctypes.c_uint8)


PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: only the SWA and recurrent sections


def read_sequence_state(context_pointer: object, sequence: int, *, partial: bool = False) -> np.ndarray:
    """A copy of `sequence`'s state: every section, or with `partial` only the uncuttable ones."""
    flags = PARTIAL_ONLY if partial else 0
    size = int(llama_cpp.llama_state_seq_get_size_ext(context_pointer, sequence, flags))
    if size == 0:
        raise StateFormatError("llama.cpp could not measure the sequence state")
    buffer = np.empty(size, dtype=np.uint8)
    written = int(
        llama_cpp.llama_state_seq_get_data_ext(
            context_pointer, buffer.ctypes.data_as(_BYTE_POINTER), size, sequence, flags
        )
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
