"""Segments: the file-sized blocks of one store written one after another into one file, so that a
restore reads a prefix's blocks in one sequential pass instead of opening, reading ahead and closing a
file per block (a 931 MiB state is 117 files of 8 MiB).

Each block keeps its own row: LRU, TTL, pins and sizing advice count blocks as before. The row's file name
says where its bytes lie, `segments/<name>.seg#<offset>+<size>`. Blocks start on page boundaries, so a
block culled or deleted has its pages punched out of the file and the disk space comes back at once (where
the file system can punch holes: where it cannot, segments are not used). A segment no row names any more is
deleted when its store ends, by a sweep every ten minutes and when a tier opens the folder, or by
`chatapp cache prune`; a sweep takes only segments unwritten for ten minutes (a store appends every few
seconds).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

FOLDER = "segments"
SUFFIX = ".seg"
ORPHAN_AGE_SECONDS = 600.0  # a segment unwritten this long, no row naming it, is nobody's store under way
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


# Exactly what SegmentWriter names: a slice of a segment of this folder, on a page boundary, of a size a file can
# have. A damaged or hostile row's name is refused whole, never half read (a path outside, a huge number).
_SLICE_NAME = re.compile(rf"({FOLDER}/[0-9a-f]{{24}}{re.escape(SUFFIX)})#([0-9]{{1,15}})\+([0-9]{{1,15}})")


def parse_slice(filename: str) -> Slice | None:
    """The slice a row's file name names; None for a file of its own. Raises SliceNameError when damaged."""
    if "#" not in filename:
        return None
    named = _SLICE_NAME.fullmatch(filename)
    if named is None or int(named[2]) % ALIGN:
        raise SliceNameError(f"not a segment slice: {filename!r}")
    return Slice(named[1], int(named[2]), int(named[3]))


class SegmentWriter:
    """Appends one store's blocks to a new segment file, made at the first block (a store of small blocks
    only makes none). The file is written by this writer alone; rows name its slices once written."""

    def __init__(self, store_directory: Path) -> None:
        self.name = f"{FOLDER}/{os.urandom(12).hex()}{SUFFIX}"
        self.path = store_directory / self.name
        self.made = False
        self._writer: int | None = None
        self._end = 0

    def append(self, parts: Sequence[np.ndarray]) -> Slice:
        """Write `parts` as one block at the next page boundary and say where; a failed write (a full disk)
        gives its space back and raises."""
        if self._writer is None:
            self.path.parent.mkdir(mode=0o700, exist_ok=True)
            self._writer = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            self.made = True
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
        return Slice(self.name, offset, size)

    def close(self) -> None:
        if self._writer is not None:
            os.close(self._writer)
            self._writer = None


def punch(path: Path, piece: Slice) -> bool:
    """Give a culled or deleted block's pages back to the file system (its bytes, in effect text, are gone
    with them); whether that was done. Never raises: a segment already gone has nothing to give back."""
    fallocate = _fallocate()
    if fallocate is None:
        return False
    length = -(-piece.size // ALIGN) * ALIGN  # the padding up to the next block is this block's too
    try:
        descriptor = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        return fallocate(descriptor, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, piece.offset, length) == 0
    finally:
        os.close(descriptor)


def can_punch_holes(store_directory: Path) -> bool:
    """Whether blocks can be punched out of a segment in this folder. Where they cannot (macOS, some network
    file systems), segments are not used: a culled or deleted block's bytes would stay on disk as long as
    any block beside it, beyond the budget and past a deletion."""
    folder = store_directory / FOLDER
    probe = folder / f".probe-{os.urandom(6).hex()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        probe.write_bytes(bytes(2 * ALIGN))
        return punch(probe, Slice(probe.name, 0, ALIGN))
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


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
