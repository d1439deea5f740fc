"""GGUF's `general.file_type` (llama.cpp's llama_ftype) as quantizations are named: 3 -> Q4_1, 15 -> Q4_K_M;
and a tensor's ggml type by name: Q4_0 -> 2."""

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


GGML_TYPES: dict[str, int] = {
    name.removeprefix("GGML_TYPE_"): value
    for name, value in vars(llama_cpp).items()
    if name.startswith("GGML_TYPE_") and name != "GGML_TYPE_COUNT" and isinstance(value, int)
}
_GGML_TYPE_NAMES: dict[int, str] = {value: name for name, value in GGML_TYPES.items()}


def ggml_type_name(ggml_type: int) -> str:
    """A tensor type's name (F16, Q6_K), or "type N" for one this build does not know."""
    return _GGML_TYPE_NAMES.get(ggml_type, f"type {ggml_type}")
