"""A GGUF file's header (metadata and tensor list) read without loading any weights.

Listing the models on a machine must not load them: the header is a few megabytes at the
front of the file (most of it the vocabulary), read here with plain file reads. Long arrays
(the vocabulary, merges) are skipped, only their length kept.
"""

from __future__ import annotations

import math
import mmap
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
KEPT_ARRAY_LENGTH = 1024  # longer arrays (tokens, merges, scores) are skipped
MAX_ARRAY_DEPTH = 4  # arrays of arrays deeper than this are a damaged file
# GGUF value types: their struct formats (fixed sizes); 8 is a string, 9 an array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GgufError(ValueError):
    """The file is not a GGUF file this reader understands (truncated, another version, not GGUF)."""


@dataclass(frozen=True)
class SkippedArray:
    """An array too long to keep: what it held and how many."""

    length: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int

    @property
    def elements(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count


@dataclass(frozen=True)
class GgufHeader:
    version: int
    metadata: dict[str, Any] = field(default_factory=dict)
    tensors: tuple[TensorInfo, ...] = ()

    def text(self, key: str) -> str:
        value = self.metadata.get(key)
        return value if isinstance(value, str) else ""

    def number(self, key: str) -> int:
        """An integer field (0 when missing, not a number, or not finite)."""
        value = self.metadata.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return 0
        return int(value)


class _Cursor:
    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.at = 0

    def unpack(self, form: str) -> Any:
        size = struct.calcsize(form)
        if self.at + size > len(self.data):
            raise GgufError("the header ends before its last field: the file is truncated")
        (value,) = struct.unpack_from(form, self.data, self.at)
        self.at += size
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        if self.at + length > len(self.data):
            raise GgufError("a string runs past the end of the file: the file is truncated")
        raw = self.data[self.at : self.at + length]
        self.at += length
        return raw.decode("utf-8", errors="replace")

    def check_count(self, count: int, smallest_item: int) -> None:
        """A count of items that cannot fit in what is left of the file is a damaged header, not a long read."""
        if count * smallest_item > len(self.data) - self.at:
            raise GgufError("a count in the header runs past the end of the file: the file is damaged")

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            length = self.unpack("<Q")
            self.at += length
        if self.at > len(self.data):
            raise GgufError("an array runs past the end of the file: the file is truncated")

    def value(self, kind: int, depth: int = 0) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise GgufError("arrays nested too deep: the file is damaged")
            item_kind = self.unpack("<I")
            length = self.unpack("<Q")
            self.check_count(length, struct.calcsize(_SCALARS[item_kind]) if item_kind in _SCALARS else 8)
            if length > KEPT_ARRAY_LENGTH:
                if item_kind == _STRING:
                    self.skip_strings(length)
                elif item_kind in _SCALARS:
                    self.at += length * struct.calcsize(_SCALARS[item_kind])
                else:
                    raise GgufError("an array of arrays too long to skip")
                return SkippedArray(length)
            return [self.value(item_kind, depth + 1) for _ in range(length)]
        raise GgufError(f"unknown GGUF value type {kind}")


def read_header(path: Path) -> GgufHeader:
    """The metadata and tensor list of a GGUF file (one part of a split model: its own tensors only)."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise GgufError(f"{path} is not a regular file")
        with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(_Cursor(data))
    except (OSError, ValueError) as error:
        if isinstance(error, GgufError):
            raise
        raise GgufError(f"cannot read {path}: {error}") from None


def _parse(cursor: _Cursor) -> GgufHeader:
    if cursor.data[:4] != MAGIC:
        raise GgufError("not a GGUF file")
    cursor.at = 4
    version = cursor.unpack("<I")
    if version not in (2, 3):
        raise GgufError(f"GGUF version {version} is not read here (2 and 3 are)")
    tensor_count = cursor.unpack("<Q")
    metadata_count = cursor.unpack("<Q")
    cursor.check_count(metadata_count, 8 + 4)  # a key's length and a value's type at least
    cursor.check_count(tensor_count, 8 + 4 + 4 + 8)
    metadata: dict[str, Any] = {}
    for _ in range(metadata_count):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.unpack("<I"))
    tensors = []
    for _ in range(tensor_count):
        name = cursor.string()
        dimensions = cursor.unpack("<I")
        shape = tuple(cursor.unpack("<Q") for _ in range(dimensions))
        ggml_type = cursor.unpack("<I")
        cursor.unpack("<Q")  # the tensor's offset in the data section
        tensors.append(TensorInfo(name, shape, ggml_type))
    return GgufHeader(version, metadata, tuple(tensors))
