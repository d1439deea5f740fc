"""GGUF's `general.file_type` (llama.cpp's llama_ftype) as quantizations are named: 3 -> Q4_1, 15 -> Q4_K_M."""

from __future__ import annotations

import llama_cpp

FILE_TYPES = {
    value: name.removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_").removeprefix("ALL_")
    for name, value in vars(llama_cpp).items()
    if name.startswith("LLAMA_FTYPE_") and name != "LLAMA_FTYPE_GUESSED" and isinstance(value, int)
}


def quantization_name(file_type: int | None) -> str:
    """The quantization's name, or "" when the file does not say (or says a type this build does not know)."""
    return FILE_TYPES.get(file_type, "") if file_type is not None else ""
