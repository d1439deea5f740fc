"""The number format of the KV cells: f16 (llama.cpp's default), or q8_0 / q4_0 for smaller states.

A quantized KV cache holds each cell in about half (q8_0) or a quarter and a bit (q4_0) of f16's
bytes, so the same RAM and disk budgets keep two to three times the prefixes, and each restore
moves that much less. llama.cpp quantizes V only under flash attention, so a quantized type turns
flash attention on. Each attention head's size must be a multiple of the type's block (32 values).
A state names its types (the layout), so the cache keeps each type's entries apart: a state never
restores into a context of another type.
"""

from __future__ import annotations

from enum import StrEnum

import llama_cpp


class KvType(StrEnum):
    F16 = "f16"
    Q8_0 = "q8_0"
    Q4_0 = "q4_0"

    @property
    def ggml_type(self) -> int:
        """ggml's number for the type, as llama.cpp's context parameters take it."""
        return int(
            {
                KvType.F16: llama_cpp.GGML_TYPE_F16,
                KvType.Q8_0: llama_cpp.GGML_TYPE_Q8_0,
                KvType.Q4_0: llama_cpp.GGML_TYPE_Q4_0,
            }[self]
        )

    @property
    def bytes_per_value(self) -> float:
        """Bytes a cell's value takes: ggml packs q8_0 and q4_0 in blocks of 32 values, each with a
        2-byte scale (34 and 18 bytes a block, against f16's 64)."""
        return {KvType.F16: 2.0, KvType.Q8_0: 34 / 32, KvType.Q4_0: 18 / 32}[self]

    @property
    def quantized(self) -> bool:
        return self is not KvType.F16
