"""Segments: the file-sized blocks of one store written one after another into one file, so that a
restore reads a prefix's blocks in one sequential pass instead of opening, reading ahead and closing a
file per block (a 931 MiB state is 117 files of 8 MiB).

Each block keeps its own row: LRU, TTL, pins and sizing advice count blocks as before. The row's file name
says where its bytes lie, `segments/<name>.seg#<offset>+<size>`. Blocks start on page boundaries, so a
block culled or deleted has its pages punched out of the file and the disk space comes back at once (where
the file system can punch holes). A segment no row names any more is deleted when its store ends, when a
tier opens the folder, or by `chatapp cache prune`; one being written is young, and is never swept.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

FOLDER = "segments"
SUFFIX = ".seg"
ALIGN = 4096  # blocks start on page boundaries: punching one out frees whole pages and touches no neighbour
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


class SliceNameError(ValueError):
    """A row's file name that claims a segment but does not say where in it (a damaged row)."""


@dataclasses.dataclass(frozen=True)
class Slice:
    """Where one block lies: `size` bytes at `offset` of the segment file `segment` (relative to the store)."""

    segment: str
    offset: int
    size: int

    @property
    def filename(self) -> str:
        return f"{self.segment}#{self.offset}+{self.size}"


def parse_slice(filename: str) -> Slice | None:
    """The slice a row's file name names; None for a file of its own. Raises SliceNameError when damaged."""
    segment, marker, where = filename.partition("#")
    if not marker:
        return None
    offset, plus, size = where.partition("+")
    if not plus or not offset.isdigit() or not size.isdigit() or not segment.endswith(SUFFIX):
        raise SliceNameError(f"not a segment slice: {filename!r}")
    return Slice(segment, int(offset), int(size))


class SegmentWriter:
    """Appends one store's blocks to a new segment file, made at the first block (a store of small blocks
    only makes none). The file is written by this writer alone; rows name its slices once written."""

    def __init__(self, store_directory: Path) -> None:
        self._store_directory = store_directory
        self._name = f"{FOLDER}/{os.urandom(12).hex()}{SUFFIX}"
        self._file: Path | None = None
        self._writer: int | None = None
        self._end = 0
        self.named = 0  # slices a committed row names: none, and the file is deleted at close

    def append(self, parts: Sequence[np.ndarray]) -> Slice:
        """Write `parts` as one block at the next page boundary and say where; a failed write (a full disk)
        gives its space back and raises."""
        if self._writer is None:
            path = self._store_directory / self._name
            path.parent.mkdir(mode=0o700, exist_ok=True)
            self._writer = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            self._file = path
        offset = -(-self._end // ALIGN) * ALIGN
        size = sum(part.nbytes for part in parts)
        try:
            position = offset
            for part in parts:
                view = memoryview(part).cast("B")  # type: ignore[arg-type]  # an ndarray is a buffer
                while view:
                    written = os.pwrite(self._writer, view, position)
                    position += written
                    view = view[written:]
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self._writer, self._end)
            raise
        self._end = offset + size
        return Slice(self._name, offset, size)

    def close(self) -> None:
        """Close the file; delete it when no row names any of its slices (every put refused or failed)."""
        if self._writer is None:
            return
        os.close(self._writer)
        self._writer = None
        if not self.named and self._file is not None:
            self._file.unlink(missing_ok=True)


def punch(path: Path, piece: Slice) -> None:
    """Give a culled block's pages back to the file system (Linux's fallocate; elsewhere nothing: the space
    returns when the whole segment goes). Never raises: a segment already gone has nothing to give back."""
    fallocate = _fallocate()
    if fallocate is None:
        return
    length = -(-piece.size // ALIGN) * ALIGN  # the padding up to the next block is this block's too
    with contextlib.suppress(OSError):
        descriptor = os.open(path, os.O_WRONLY)
        try:
            fallocate(descriptor, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, piece.offset, length)
        finally:
            os.close(descriptor)


@functools.cache
def _fallocate() -> Callable[[int, int, int, int], int] | None:
    """The C library's fallocate, where there is one (Linux)."""
    try:
        function = ctypes.CDLL(None, use_errno=True).fallocate
    except (AttributeError, OSError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong)
    function.restype = ctypes.c_int
    return function


def named_segments(filenames: Iterable[str | None]) -> set[str]:
    """The segment files that rows with these file names need."""
    return {name.partition("#")[0] for name in filenames if name is not None and "#" in name}


def sweep(store_directory: Path, named: set[str], min_age_seconds: float) -> int:
    """Delete segment files no row names, older than `min_age_seconds` (one being written is younger:
    its writer appends to it); return how many."""
    folder = store_directory / FOLDER
    if not folder.is_dir():
        return 0
    cutoff = time.time() - min_age_seconds
    removed = 0
    for path in folder.glob(f"*{SUFFIX}"):
        with contextlib.suppress(OSError):
            if f"{FOLDER}/{path.name}" not in named and path.stat().st_mtime <= cutoff:
                path.unlink()
                removed += 1
    return removed
