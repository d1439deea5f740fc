"""Tier "disk": block payloads in a `diskcache.Cache`, LRU under a byte budget, with TTL.

Each block is one row: the payload (raw bytes, a file once large) and, in the row's
tag, the block's metadata record, so the index is rebuilt from the tags alone at
start-up. Pinned blocks live in a second cache that is never culled. Nothing is ever
unpickled: the Disk subclass refuses pickled keys and values, and file names that leave
the folder, since a cache file is input.

The disk is a convenience, never a reason to fail: when the folder cannot be written (disk
full, read-only, I/O error) the tier switches itself off for the session and keeps the
reason in `problem`, so that the cache goes on in RAM and the app says so once. A
database too damaged to open is moved aside, named in `problem`, and a new one started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import io
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import diskcache
import numpy as np
from diskcache.core import MODE_BINARY, MODE_PICKLE, MODE_RAW

from cache.blocks import BlockInfo, PayloadParts, RecordError, payload_checksum
from cache.keys import BlockKey
from cache.segments import FOLDER as SEGMENTS
from cache.segments import (
    ORPHAN_AGE_SECONDS,
    SegmentWriter,
    Slice,
    SliceNameError,
    can_punch_holes,
    named_segments,
    parse_slice,
    punch,
    sweep,
)
from cache.stats import DiskSizes, DiskStats, TierCounters
from cache.tier import Keep, Payload, Sink, Stored, keeps
from cache.tiers import ReuseTier

log = logging.getLogger(__name__)

PRIVATE = 0o700
UNLIMITED = 1 << 62
# A row last used further in the future than this means the clock went back: its age is unknown.
CLOCK_SLACK_SECONDS = 300.0
STORE_TIME_OVERLAP_SECONDS = 120.0  # past diskcache's 60 s wait for the database lock (see new_entries)
DISK_ERRORS = (OSError, sqlite3.Error, diskcache.Timeout)
_ROW_BYTES = "rowid, filename, size + COALESCE(length(value), 0) FROM Cache"
EXPIRED_ROWS = f"SELECT {_ROW_BYTES} WHERE expire_time IS NOT NULL AND expire_time < ? ORDER BY expire_time"
LEAST_RECENT_ROWS = f"SELECT {_ROW_BYTES} ORDER BY access_time"
# Payload files a restore reads at once, each on its own thread (a read releases the GIL): the kernel's copies
# and the new memory's page faults then run side by side, and a cold disk gets several requests at a time.
# Measured on 2 vCPUs, 32 files of 1.35 MB read alone: page cache warm 26 ms one after another, 16-17 ms four at
# once; pages dropped 43-48 ms (one after another, every file's pages asked for ahead), 26-29 ms four at once.
# In a whole restore (figure R) much less: a cold f16 read step 28-34 -> 24-27 ms, warm 16-18 -> 15-16 ms.
READ_THREADS = 4
T = TypeVar("T")


class BytesOnlyDisk(diskcache.Disk):  # type: ignore[misc]  # diskcache ships no type information
    """diskcache storage that accepts str keys and bytes/int values, and never unpickles."""

    def put(self, key: object) -> tuple[object, bool]:
        if not isinstance(key, str):
            raise TypeError("cache keys are strings")
        stored: tuple[object, bool] = super().put(key)
        return stored

    def get(self, key: object, raw: bool) -> object:
        if not raw:
            raise RecordError("refusing a pickled key")
        return super().get(key, raw)

    def store(self, value: object, read: bool, key: object = diskcache.core.UNKNOWN) -> tuple[object, ...]:
        if isinstance(value, Slice):  # already written to its segment: the row only says where
            return value.size, MODE_BINARY, value.filename, None
        if isinstance(value, PayloadParts):
            value = value.joined() if value.nbytes < self.min_file_size else value
        elif isinstance(value, bytes) and len(value) >= self.min_file_size:
            value = PayloadParts(_as_parts(value))
        if isinstance(value, PayloadParts):
            # diskcache writes bytes as the lines of a BytesIO: for KV data one write call per ~500 bytes,
            # 16 ms an 8 MiB block against 3 ms for plain writes, the writer's main cost beside decoding.
            filename, full_path = self.filename(key, value)
            _write_new_file(full_path, value.parts)
            return value.nbytes, MODE_BINARY, filename, None
        if not isinstance(value, bytes | int) or isinstance(value, bool):
            raise TypeError("cache values are bytes or integers")
        stored: tuple[object, ...] = super().store(value, read, key=key)
        return stored

    def fetch(self, mode: int, filename: str | None, value: object, read: bool) -> object:
        if mode == MODE_PICKLE:
            raise RecordError("refusing a pickled value")
        if not _inside(filename):
            # A row names its payload file; one outside this folder is a damaged or hostile row.
            raise RecordError("refusing a payload file outside the cache folder")
        if filename is not None and parse_slice(filename) is not None:
            raise RecordError("a block in a segment is read by the disk tier, its checksum checked")
        return super().fetch(mode, filename, value, read)

    def remove(self, file_path: str) -> None:
        if not _inside(file_path):
            return  # the row is gone; a file it named outside the folder is not ours to delete
        piece = parse_slice(file_path)
        if piece is not None:
            punch(Path(self._directory) / piece.segment, piece)  # the segment itself goes when no row names it
            return
        super().remove(file_path)


def _write_new_file(full_path: str, parts: Sequence[np.ndarray]) -> None:
    """Write `parts` to a file that must not exist yet, its folder made if missing (retried as diskcache
    does: another process's cull may remove an empty folder between the two)."""
    for attempt in range(10):
        with contextlib.suppress(OSError):  # a folder removed meanwhile fails the open below, which tries again
            os.makedirs(os.path.dirname(full_path), exist_ok=True)
        try:
            writer = open(full_path, "xb")  # noqa: SIM115 - closed below; the open alone is retried
        except FileNotFoundError:
            if attempt == 9:
                raise
            continue
        try:
            with writer:
                for part in parts:
                    writer.write(part)  # type: ignore[arg-type]  # an ndarray is a buffer
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(full_path)  # a half-written file no row names (a full disk): not left for the sweep
            raise
        return


def _as_parts(payload: bytes) -> tuple[np.ndarray, ...]:
    return (np.frombuffer(payload, dtype=np.uint8),)


def _inside(filename: str | None) -> bool:
    """Whether a row's file name names a file in its store's folder (a slice: one well named)."""
    if filename is None:
        return True
    try:
        piece = parse_slice(filename)
    except SliceNameError:
        return False
    path = Path(piece.segment if piece is not None else filename)
    return not path.is_absolute() and ".." not in path.parts


def open_bytes_store(directory: Path, size_limit: int, cull_limit: int = 16) -> diskcache.Cache:
    """A private diskcache folder with LRU culling that stores only bytes (`cull_limit` 0: culled by the
    caller, `cull_to_budget`)."""
    directory.mkdir(mode=PRIVATE, parents=True, exist_ok=True)
    os.chmod(directory, PRIVATE)
    return diskcache.Cache(
        str(directory),
        size_limit=size_limit,
        eviction_policy="least-recently-used",
        disk=BytesOnlyDisk,
        disk_min_file_size=32 * 1024,
        cull_limit=cull_limit,
        statistics=False,
    )


def remove_orphan_files(store: diskcache.Cache, min_age_seconds: float = ORPHAN_AGE_SECONDS) -> int:
    """Delete payload files (*.val) and segments that no row of `store` names; return how many.

    A process killed between writing a payload file and committing its row leaves such a
    file. Another process writes its file a moment before it commits the row naming it, so
    only files older than `min_age_seconds` are taken as orphans (`sweep_segments` alone, with
    one query for segments only, is what runs while the cache is open).
    """
    folder = Path(store.directory)
    cutoff = time.time() - min_age_seconds
    named = {row[0] for row in store._sql("SELECT filename FROM Cache WHERE filename IS NOT NULL").fetchall()}
    orphans = [
        path
        for path in folder.rglob("*.val")
        if str(path.relative_to(folder)) not in named and path.stat().st_mtime <= cutoff
    ]
    for path in orphans:
        path.unlink(missing_ok=True)
    return len(orphans) + sweep(folder, named_segments(named), min_age_seconds)


def sweep_segments(store: diskcache.Cache, min_age_seconds: float = ORPHAN_AGE_SECONDS) -> int:
    """Delete the segment files no row of `store` names (their blocks all culled, or a store killed before
    its first row), older than `min_age_seconds`; return how many. One query, one folder listing."""
    names = store._sql("SELECT filename FROM Cache WHERE filename LIKE ?", (f"{SEGMENTS}/%",)).fetchall()
    return sweep(Path(store.directory), named_segments(name for (name,) in names), min_age_seconds)


def names_segment(store: diskcache.Cache, segment: str) -> bool:
    """Whether a row names a slice of `segment` (a range on the name, which a LIKE pattern would not be:
    'x.seg#' up to 'x.seg$')."""
    return (
        store._sql(
            "SELECT 1 FROM Cache WHERE filename >= ? AND filename < ? LIMIT 1", (f"{segment}#", f"{segment}$")
        ).fetchone()
        is not None
    )


def cull_to_budget(store: diskcache.Cache, now: float) -> int:
    """Drop expired rows, then the least recently used, until the store is within its size limit: exactly
    as many as that takes, so the tier is the LRU sizing advice counts. (diskcache's own cull, left off
    here, drops `cull_limit` rows whenever the store is full: at a budget of a few dozen blocks, most of
    it.) A row counts its file's size or its value's length: the pages an inline value frees are reused
    by the next rows, so the volume stays and the next store culls as much as it adds. Returns how many."""
    if store.volume() <= store.size_limit:
        return 0
    victims: dict[int, str | None] = {}
    with store._transact(retry=True) as (sql, cleanup):
        excess = store.volume() - store.size_limit  # again, inside: another thread or process may have culled
        for query, arguments in ((EXPIRED_ROWS, (now,)), (LEAST_RECENT_ROWS, ())):
            rows = sql(query, arguments)
            while excess > 0 and (batch := rows.fetchmany(64)):
                for rowid, filename, size in batch:
                    if excess > 0 and rowid not in victims:
                        victims[rowid] = filename
                        excess -= size
            rows.close()  # before the rows it read are deleted
        for chunk in _chunks(list(victims)):
            sql(f"DELETE FROM Cache WHERE rowid IN ({','.join('?' * len(chunk))})", chunk)
        for filename in victims.values():
            cleanup(filename)
    return len(victims)


def _chunks(items: list[T], size: int = 500) -> Iterator[list[T]]:
    """`items` a few hundred at a time: SQLite bounds the parameters of one statement."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclasses.dataclass(frozen=True)
class _Row:
    """What a block's row says of its payload: inline (`value`) or in a file (`filename`), in the store it was
    found in (`pinned`: read once, as a pin may move the block meanwhile)."""

    pinned: bool
    expire_time: float | None
    mode: int
    filename: str | None
    value: object

    @property
    def refused(self) -> bool:
        """A pickle, a text, an inline value that is not bytes, or a file outside the folder: a damaged or
        hostile row, never read."""
        if self.mode == MODE_RAW:
            return not isinstance(self.value, bytes)
        return self.mode != MODE_BINARY or self.filename is None or not _inside(self.filename)


@functools.cache
def _readers(threads: int) -> ThreadPoolExecutor:
    """The threads that read payload files, shared by every tier of the process (idle between restores).

    Shared, so restores on two engines' threads queue their files behind each other's (first come, first read),
    and reads that hang (a stalled network file system) hold every tier's restores and the interpreter's exit;
    a restore's files are few next to what computing them again costs, and the cache folder is local."""
    return ThreadPoolExecutor(threads, thread_name_prefix="cache-disk-read")


if hasattr(os, "register_at_fork"):
    # A forked child has none of its parent's threads: a pool it inherited would never run a read.
    os.register_at_fork(after_in_child=_readers.cache_clear)


@dataclasses.dataclass(frozen=True)
class _Source:
    """Where a row's payload lies: a file of its own (`size` None: the file is the payload), or `size` bytes at
    `offset` of a segment."""

    path: Path
    offset: int = 0
    size: int | None = None


def _source(directory: Path, filename: str) -> _Source:
    piece = parse_slice(filename)  # a damaged name is refused before: `_Row.refused`
    if piece is None:
        return _Source(directory / filename)
    return _Source(directory / piece.segment, piece.offset, piece.size)


def _read_into(file: io.FileIO, source: _Source, target: np.ndarray) -> np.ndarray | None:
    """The payload read into `target` (its record's size); None when it cannot be read. A payload of another
    size (a file shorter or longer, a slice named with another size) gives a view of another size: damaged."""
    view = target.data
    if source.size is not None and source.size != len(view):
        return target[:0]
    try:
        file.seek(source.offset)
        done = 0
        while done < len(view) and (read := file.readinto(view[done:])):
            done += read
        longer = source.size is None and done == len(view) and file.read(1)
    except OSError:
        return None
    return target if done == len(view) and not longer else target[: min(done, len(view) - 1)]


def _open(path: Path) -> io.FileIO | None:
    """The file open for reading; None when it cannot be: gone (culled by another process since the query), or
    no descriptor free."""
    try:
        return io.FileIO(path, "r")
    except OSError:
        return None


Checked = tuple[Payload, int]  # a payload as read, and its checksum (taken by the thread that read it)
# Called with a block's index among those asked for and its payload, on the thread that read it, once its
# size and checksum are those of its record; the payload is valid during the call only unless kept.
Reader = Callable[[np.ndarray], np.ndarray | None]  # reads one payload into the memory given (see _read_into)
Read = Callable[[int, Reader], Checked | None]  # a block's index among those asked for, and how to read it

_scratch = threading.local()


def _scratch_of(size: int) -> np.ndarray:
    """This thread's reused memory for one block: reads into it take no page faults, and stay this small."""
    memory: np.ndarray | None = getattr(_scratch, "memory", None)
    if memory is None or memory.size < size:  # with room for a slightly larger block (blocks differ by a few bytes)
        memory = _scratch.memory = np.empty(size * 5 // 4, dtype=np.uint8)
    return memory[:size]


def _read_ahead(runs: Sequence[Sequence[tuple[int, _Source]]]) -> None:
    """Ask the kernel for every byte of a restore at once (POSIX_FADV_WILLNEED), so a cold disk reads them
    side by side while the threads copy the first: 117 files of 8 MiB from a dropped page cache, 4 threads,
    took 490 ms instead of 790 ms (one file of the same bytes: 340-380 ms). Where it cannot: nothing."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    for run in runs:
        first, last = run[0][1], run[-1][1]
        length = 0 if last.size is None else last.offset + last.size - first.offset  # 0: to the file's end
        with contextlib.suppress(OSError):
            descriptor = os.open(first.path, os.O_RDONLY)
            try:
                advise(descriptor, first.offset, length, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(descriptor)


def _runs(files: Sequence[tuple[int, _Source]], threads: int) -> list[list[tuple[int, _Source]]]:
    """Payload files as they are read: a file of its own alone; a segment's slices in file order, cut into at
    most `threads` runs of neighbours, so that threads read side by side and each reads on in one file."""
    by_file: dict[Path, list[tuple[int, _Source]]] = {}
    for number, source in files:
        by_file.setdefault(source.path, []).append((number, source))
    runs: list[list[tuple[int, _Source]]] = []
    for pieces in by_file.values():
        pieces.sort(key=lambda piece: piece[1].offset)
        share = -(-len(pieces) // threads)
        runs.extend(pieces[start : start + share] for start in range(0, len(pieces), share))
    return runs


def _read_run(run: Sequence[tuple[int, _Source]], read: Read) -> list[Checked | None]:
    """One thread's share of a restore: the payloads of `run` in order, its file opened once."""
    file = _open(run[0][1].path)
    if file is None:
        return [None] * len(run)
    with file:
        return [read(number, functools.partial(_read_into, file, source)) for number, source in run]


def _checked(payload: Payload | None) -> Checked | None:
    return (payload, payload_checksum(payload)) if payload is not None else None


def _read_payloads(directories: dict[bool, Path], rows: Sequence[_Row | None], read: Read) -> list[Checked | None]:
    """Each row's payload (None: none, refused, or its file gone), in the order of `rows`: inline ones from the
    row, files by `read(index, reader)`, READ_THREADS runs at a time (at most that many files open)."""
    payloads: list[Checked | None] = [None] * len(rows)
    files: list[tuple[int, _Source]] = []
    for number, row in enumerate(rows):
        if row is None or row.refused:
            continue
        if row.mode == MODE_RAW:
            assert isinstance(row.value, bytes)  # else refused
            payloads[number] = _checked(row.value)
        else:
            assert row.filename is not None  # else refused
            files.append((number, _source(directories[row.pinned], row.filename)))
    runs = _runs(files, READ_THREADS)
    done: list[list[Checked | None]] | None = None
    reads: list[futures.Future[list[Checked | None]]] = []
    if len(runs) > 1:  # one run (one block, one segment's few) wakes no thread
        _read_ahead(runs)
        with contextlib.suppress(RuntimeError):  # the pool is shut down (the interpreter exits): read here
            for run in runs:
                reads.append(_readers(READ_THREADS).submit(_read_run, run, read))
        futures.wait(reads)  # every read ends before a failure is raised or read again: none writes after
        if len(reads) == len(runs):
            done = [future.result() for future in reads]
    if done is None:
        done = [_read_run(run, read) for run in runs]
    for run, results in zip(runs, done, strict=True):
        for (number, _source_of), payload in zip(run, results, strict=True):
            payloads[number] = payload
    return payloads


def clear_store(store: diskcache.Cache) -> int:
    """Every row and payload file of one store, orphans included; returns how many rows."""
    removed = int(store.clear(retry=True))
    remove_orphan_files(store, min_age_seconds=0)
    return removed


def _describe(error: BaseException) -> str:
    if (isinstance(error, OSError) and error.errno == errno.ENOSPC) or "full" in str(error).lower():
        return "the disk is full"
    if (isinstance(error, OSError) and error.errno in (errno.EROFS, errno.EACCES, errno.EPERM)) or "readonly" in str(
        error
    ).lower():
        return "the folder is read-only"
    return f"{type(error).__name__}: {error}"


def set_aside(directory: Path) -> Path:
    """Rename a damaged cache folder out of the way (never deleted: it may help a bug report)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = directory.with_name(f"{directory.name}.damaged-{stamp}")
    number = 1
    while target.exists():
        number += 1
        target = directory.with_name(f"{directory.name}.damaged-{stamp}-{number}")
    directory.rename(target)
    return target


def open_store(directory: Path, size_limit: int, cull_limit: int = 16) -> tuple[diskcache.Cache, str | None]:
    """Open one store; a database too damaged to open is moved aside and a new one begun.

    Returns the store and, when something was moved aside, a sentence saying so.
    """
    try:
        return open_bytes_store(directory, size_limit, cull_limit), None
    except sqlite3.DatabaseError as error:
        if isinstance(error, sqlite3.OperationalError):
            raise  # locked, read-only, cannot open: not damage
        moved = set_aside(directory)
        return open_bytes_store(
            directory, size_limit, cull_limit
        ), f"the disk cache {directory} was damaged ({error}); it was moved to {moved.name} and a new one begun"


class DiskTier:
    """The cache's entries on disk (a `Tier`), shared by every process and namespace using the folder."""

    name = ReuseTier.DISK
    checks_payloads = True  # every read is checked against the record's checksum and size

    def __init__(
        self,
        directory: Path,
        budget_bytes: int,
        ttl_seconds: float,
        namespace_id: bytes,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.directory = directory
        self.budget_bytes = budget_bytes
        self.ttl_seconds = ttl_seconds
        self.namespace_id = namespace_id
        self.counters = TierCounters()
        self.problem: str | None = None  # why the tier is off, or what it repaired
        self.enabled = True
        self._clock = clock or (lambda: time.time())  # looked up per call: diskcache reads the same clock
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()  # the rows read so far (`new_entries`)
        self._blocks: diskcache.Cache | None = None
        self._pinned: diskcache.Cache | None = None
        self._last_store_time = {False: 0.0, True: 0.0}  # per store (pinned or not): rows read up to here
        self._recent_rows: dict[bool, dict[int, float]] = {False: {}, True: {}}  # rowid -> store time, in the overlap
        self._segments = False  # whether stores write segments (where blocks can be punched out of them)
        self._storing = threading.local()  # the segment of the store under way on this thread (`storing`)
        self._last_sweep = time.monotonic()
        try:
            directory.mkdir(mode=PRIVATE, parents=True, exist_ok=True)
            self._blocks, repaired = open_store(directory / "blocks", budget_bytes, cull_limit=0)  # culled exactly
            self._pinned, repaired_pinned = open_store(directory / "pinned", UNLIMITED)
            self.problem = repaired or repaired_pinned
            for store in (self._blocks, self._pinned):
                # What other processes stored is found by store time (new_entries).
                store._sql("CREATE INDEX IF NOT EXISTS Cache_store_time ON Cache (store_time)")
            self._segments = can_punch_holes(Path(self._blocks.directory))
            sweep_segments(self._blocks)
        except DISK_ERRORS as error:
            self._switch_off(error)

    def _switch_off(self, error: BaseException) -> None:
        """Stop using the disk for this session, keeping the first reason."""
        if self.enabled:
            self.enabled = False
            self.problem = (
                f"the disk cache in {self.directory} is off for this session: {_describe(error)}; "
                "KV states are kept in RAM only"
            )
            log.warning(self.problem)

    def _guarded(self, action: Callable[[], T], fallback: T) -> T:
        """Run a disk action; a busy database skips it, any other failure switches the tier off."""
        if not self.enabled:
            return fallback
        try:
            return action()
        except diskcache.Timeout:
            return fallback  # another process holds the database: skip this one action
        except DISK_ERRORS as error:
            self._switch_off(error)
            return fallback

    def close(self) -> None:
        for store in (self._blocks, self._pinned):
            if store is not None:
                with contextlib.suppress(*DISK_ERRORS):
                    store.close()

    def _store(self, pinned: bool) -> diskcache.Cache:
        store = self._pinned if pinned else self._blocks
        assert store is not None
        return store

    def new_entries(self) -> list[BlockInfo]:
        """Blocks stored since the last read (at the first read, every live one: the index at
        start-up), by this process or another one on the same folder. No payload is read.

        Rows are read by their store time (indexed) from a little before the newest one seen,
        so asking costs one query over the last few seconds' rows. The overlap is there because
        diskcache takes a row's store time before it waits for the database: another process
        may commit a row stamped earlier than one already read. A block stored again after a
        clear has a new store time and is read again; a clock set back hides new rows until
        the next start: a lost hit, never a wrong one.
        """
        with self._read_lock:  # the engine thread and the pins' thread both ask
            return self._guarded(self._rows_after_last_read, [])

    def _rows_after_last_read(self) -> list[BlockInfo]:
        infos: list[BlockInfo] = []
        now = self._clock()
        for pinned in (False, True):
            store = self._store(pinned)
            since = self._last_store_time[pinned] - STORE_TIME_OVERLAP_SECONDS
            seen = self._recent_rows[pinned]
            for row in [row for row, stamp in seen.items() if stamp <= since]:
                del seen[row]  # out of the overlap: never asked for again
            rows = store._sql(
                "SELECT rowid, store_time, tag FROM Cache WHERE store_time > ? AND raw = 1 AND tag IS NOT NULL "
                "AND (expire_time IS NULL OR expire_time > ?)",
                (since, now),
            ).fetchall()
            for rowid, store_time, tag in rows:
                if seen.get(rowid) == store_time:
                    continue  # read in an earlier overlap
                seen[rowid] = store_time
                self._last_store_time[pinned] = max(self._last_store_time[pinned], store_time)
                try:
                    infos.append(BlockInfo.decode(bytes(tag), self.namespace_id))
                except RecordError:
                    continue  # another namespace's block, or a damaged record: not ours to use
        return infos

    @contextlib.contextmanager
    def storing(self) -> Iterator[None]:
        """The file-sized blocks `put` on this thread meanwhile go into one segment, closed at the end."""
        writer = SegmentWriter(Path(self._store(False).directory)) if self.enabled and self._segments else None
        outer = getattr(self._storing, "segment", None)
        self._storing.segment = writer
        try:
            yield
        finally:
            self._storing.segment = outer
            if writer is not None and writer.made:
                writer.close()
                # No row names it (every put failed, or the budget culled them all meanwhile): nobody else will.
                try:
                    named = names_segment(self._store(False), writer.name)
                except DISK_ERRORS:
                    named = True  # not known: the sweeps take it once it is old, if no row names it
                if not named:
                    writer.path.unlink(missing_ok=True)

    def put(self, info: BlockInfo, payload: Stored) -> bool:
        """Store a block, appended to the segment of the store under way (`storing`) when it is a file-sized one
        that is not pinned; False when the disk could not take it (the tier may now be off, or the block is
        larger than the whole budget: kept, it would cull everything else)."""
        segment: SegmentWriter | None = getattr(self._storing, "segment", None)
        if isinstance(payload, np.ndarray):
            payload = PayloadParts((payload,))
        size = payload.nbytes if isinstance(payload, PayloadParts) else len(payload)
        if not info.pinned and size > self.budget_bytes:
            return False
        expire = None if info.pinned else self.ttl_seconds

        def write() -> bool:
            store = self._store(info.pinned)
            value: bytes | PayloadParts | Slice = payload
            if segment is not None and not info.pinned and size >= store.disk.min_file_size:
                value = segment.append(payload.parts if isinstance(payload, PayloadParts) else _as_parts(payload))
            return self._set(store, info.key.hex(), value, expire, info.encode(self.namespace_id))

        stored = self._guarded(write, False)
        if stored:
            with self._lock:
                self.counters.bytes_written += size
        return bool(stored)

    def _set(
        self,
        store: diskcache.Cache,
        name: str,
        payload: bytes | PayloadParts | Slice,
        expire: float | None,
        tag: bytes,
    ) -> bool:
        """Write a row, then bring the store back within its budget."""
        written = bool(store.set(name, payload, expire=expire, tag=tag, retry=True))
        if store is self._blocks:
            cull_to_budget(store, self._clock())
            if time.monotonic() - self._last_sweep >= ORPHAN_AGE_SECONDS:
                # Segments emptied by culls and deletions: in a process that runs for days, not only at start.
                self._last_sweep = time.monotonic()
                sweep_segments(store)
        return written

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """The reads of one restore in one transaction per store: each read also updates the row's
        last use (LRU) and its expiry (TTL), two commits a block otherwise. A database that cannot
        open one is read as before; one that fails to commit switches the tier off, like any write."""
        stack = contextlib.ExitStack()
        if self.enabled:
            try:
                for store in (self._blocks, self._pinned):
                    if store is not None:
                        stack.enter_context(store.transact(retry=True))
            except DISK_ERRORS:
                self._closed(stack)
                stack = contextlib.ExitStack()
        try:
            yield
        except BaseException as failure:
            try:
                stack.__exit__(type(failure), failure, failure.__traceback__)  # rolls back
            except BaseException as error:  # the body's failure raised again, or the rollback's own
                if error is not failure and isinstance(error, DISK_ERRORS):
                    self._abandon(error)
            raise
        else:
            self._closed(stack)

    def _closed(self, stack: contextlib.ExitStack) -> None:
        try:
            stack.close()
        except DISK_ERRORS as error:
            self._abandon(error)

    def _abandon(self, error: BaseException) -> None:
        """A transaction that neither committed nor rolled back: off for the session, and this thread's
        connections closed, which ends the transaction so that other processes are not kept waiting."""
        self._switch_off(error)
        for store in (self._blocks, self._pinned):
            if store is not None:
                with contextlib.suppress(*DISK_ERRORS):
                    store.close()

    def read_into(self, infos: Sequence[BlockInfo], sink: Sink, *, keep: Keep) -> list[bool]:
        """Hand each intact payload of `infos` to `sink` as it is read; which ones were. None is handed where
        missing, damaged, expired or doubtful (those rows are deleted). The rows come in one query per store,
        the files READ_THREADS at a time, and the kept ones are marked used (LRU) with their TTL renewed in one
        update: `infos` in the order a fetch wants them kept (first: kept longest), as `touch` takes them.

        Payloads in files are read into new memory the sink may keep (`keep`), else into the reading
        thread's scratch, valid during the call only: a prefix of gigabytes is then never held twice.
        A batch's marks of use are committed together (`reading`). One entry's read (a checkpoint, a pin's)
        commits its own and holds no transaction, which a restore on another thread would wait behind."""
        with self.reading() if len(infos) > 1 else contextlib.nullcontext():
            return self._read_into(infos, sink, keep=keep)

    def _read_into(self, infos: Sequence[BlockInfo], sink: Sink, *, keep: Keep) -> list[bool]:
        sizes = [info.payload_size for info in infos]

        def read(number: int, reader: Reader) -> Checked | None:
            target = np.empty(sizes[number], dtype=np.uint8) if keeps(keep, number) else _scratch_of(sizes[number])
            checked = _checked(reader(target))
            if checked is not None and len(checked[0]) == sizes[number] and checked[1] == infos[number].checksum:
                sink(number, checked[0])
            return checked

        rows, payloads = self._read(infos, read)
        for number, (row, payload) in enumerate(zip(rows, payloads, strict=True)):
            if payload is not None and row is not None and row.mode == MODE_RAW:
                sink(number, payload)  # inline (a few kilobytes): here, not on a reader
        return [payload is not None for payload in payloads]

    def _read(self, infos: Sequence[BlockInfo], read: Read) -> tuple[Sequence[_Row | None], list[Payload | None]]:
        """The rows of `infos` and the payloads `read` gave for those there, intact and unexpired; the others'
        rows deleted, the kept ones marked used."""
        nothing: list[Payload | None] = [None] * len(infos)
        if not self.enabled or not infos:
            return [None] * len(infos), nothing
        rows = self._guarded(lambda: self._rows_of(infos), None)
        if rows is None:
            return [None] * len(infos), nothing
        reads = _read_payloads({pinned: Path(self._store(pinned).directory) for pinned in (False, True)}, rows, read)
        now = self._clock()
        kept: list[tuple[BlockInfo, _Row]] = []
        dropped: list[tuple[BlockInfo, _Row]] = []
        payloads: list[Payload | None] = [None] * len(infos)
        for number, (info, row, checked) in enumerate(zip(infos, rows, reads, strict=True)):
            if row is None or row.refused or checked is None:
                # Culled or expired since the index learnt of it, or a file gone under its row (culled just now);
                # a refused row (a pickle, a file outside the folder) is dropped.
                dropped.extend([(info, row)] if row is not None and row.refused else [])
                self._count(hit=False, evicted=True)
                continue
            clock_went_back = (
                row.expire_time is not None and row.expire_time - self.ttl_seconds > now + CLOCK_SLACK_SECONDS
            )
            payload, checksum = checked
            if len(payload) != info.payload_size or checksum != info.checksum or clock_went_back:
                dropped.append((info, row))
                self._count(hit=False, expired=clock_went_back)
                continue
            kept.append((info, row))
            payloads[number] = payload
            self._count(hit=True, read=len(payload))
        for info, row in dropped:
            self._drop_row(row.pinned, info.key.hex())  # from the store it was found in
        names = [info.key.hex() for info, row in kept if not row.pinned]
        if names:
            self._guarded(lambda: self._mark_used(names), False)
        return rows, payloads

    def _rows_of(self, infos: Sequence[BlockInfo]) -> list[_Row | None]:
        """Each entry's unexpired row in the store its record names (None: none there)."""
        now = self._clock()
        keys = [(info.pinned, info.key.hex()) for info in infos]  # read once: a pin may move a block meanwhile
        rows: dict[tuple[bool, str], _Row] = {}
        for pinned in (False, True):
            names = [name for in_pinned, name in keys if in_pinned == pinned]
            for chunk in _chunks(names):
                for name, expire_time, mode, filename, value in (
                    self._store(pinned)
                    ._sql(
                        "SELECT key, expire_time, mode, filename, value FROM Cache WHERE raw = 1 "
                        f"AND key IN ({','.join('?' * len(chunk))}) AND (expire_time IS NULL OR expire_time > ?)",
                        (*chunk, now),
                    )
                    .fetchall()
                ):
                    rows[(pinned, name)] = _Row(pinned, expire_time, mode, filename, value)
        return [rows.get(key) for key in keys]

    def _count(self, *, hit: bool, read: int = 0, evicted: bool = False, expired: bool = False) -> None:
        with self._lock:  # counters only: a database call under it could wait on another thread's transaction
            self.counters.hits += int(hit)
            self.counters.misses += int(not hit)
            self.counters.bytes_read += read
            self.counters.evictions += int(evicted)
            self.counters.expirations += int(expired)

    def _mark_used(self, names: Sequence[str]) -> bool:
        """Rows (first: kept longest) used now, their TTL renewed, in one transaction; rows gone or expired stay so."""
        store = self._store(False)
        now = self._clock()
        expire = now + self.ttl_seconds
        rows = [(now - rank * 1e-6, expire, name, now) for rank, name in enumerate(names)]
        with store.transact(retry=True):
            store._con.executemany(
                "UPDATE Cache SET access_time = ?, expire_time = ? WHERE key = ? AND raw = 1 "
                "AND (expire_time IS NULL OR expire_time > ?)",
                rows,
            )
        return True

    def touch(self, infos: Sequence[BlockInfo]) -> None:
        """Mark blocks just served from RAM as used on disk too: their last use (LRU) and expiry (TTL), in
        one transaction. Else a prefix served from RAM every day ages on disk unseen, is culled or expires
        there, and is gone at the next start; and sizing advice, which counts one recency over both tiers,
        would not describe the cache. `infos` in the order a fetch wants them kept (first: kept longest).
        Rows gone or expired stay so; pinned ones are never culled and need none."""
        names = [info.key.hex() for info in infos if not info.pinned]
        if names and self.enabled:
            self._guarded(lambda: self._mark_used(names), False)

    def holding(self, infos: Sequence[BlockInfo]) -> set[BlockKey]:
        """Which of these blocks the disk keeps, unexpired (pinned ones always); none while it is off."""
        pinned = {info.key for info in infos if info.pinned}
        names = [info.key.hex() for info in infos if not info.pinned]
        if not self.enabled or not names:
            return pinned

        def query() -> set[BlockKey]:
            store, now = self._store(False), self._clock()
            found: set[BlockKey] = set()
            for chunk in _chunks(names):
                rows = store._sql(
                    f"SELECT key FROM Cache WHERE raw = 1 AND key IN ({','.join('?' * len(chunk))}) "
                    "AND (expire_time IS NULL OR expire_time > ?)",
                    (*chunk, now),
                ).fetchall()
                found.update(BlockKey(bytes.fromhex(name)) for (name,) in rows)
            return found

        nothing: set[BlockKey] = set()
        return pinned | self._guarded(query, nothing)

    def discard(self, info: BlockInfo) -> None:
        """Drop a block from the store its record names (a pinned copy another process made stays)."""
        self._drop_row(info.pinned, info.key.hex())

    def _drop_row(self, pinned: bool, name: str) -> None:
        if self.enabled:
            store = self._store(pinned)
            self._guarded(lambda: store.delete(name, retry=True), False)

    def set_pinned(self, info: BlockInfo, payload: bytes, pinned: bool) -> None:
        """Move a block between the culled and the never-culled store."""
        if not self.enabled:
            info.pinned = pinned
            return
        source, target = (self._store(False), self._store(True)) if pinned else (self._store(True), self._store(False))
        expire = None if pinned else self.ttl_seconds
        tag = dataclasses.replace(info, pinned=pinned).encode(self.namespace_id)
        # The copy first, then the record says where it is, then the old copy goes: a reader in between
        # finds the block in the store the record names (pins are made beside the engine's own reads).
        if self._guarded(lambda: self._set(target, info.key.hex(), payload, expire, tag), False):
            info.pinned = pinned
            self._guarded(lambda: source.delete(info.key.hex(), retry=True), False)

    def prune(self) -> int:
        """Drop expired rows now; return how many."""
        removed = self._guarded(lambda: self._store(False).expire(now=self._clock(), retry=True), 0)
        with self._lock:
            self.counters.expirations += removed
        return removed

    def clear(self) -> int:
        return self._guarded(lambda: clear_store(self._store(False)) + clear_store(self._store(True)), 0)

    def stats(self) -> DiskStats:
        return {
            "enabled": self.enabled,
            "problem": self.problem,
            **self.sizes(),
            "budget_bytes": self.budget_bytes,
            "ttl_seconds": self.ttl_seconds,
            **self.counters.as_dict(),
        }

    def sizes(self) -> DiskSizes:
        """Entries and bytes on disk (all namespaces), pinned included."""
        nothing: DiskSizes = {"entries": 0, "bytes": 0, "pinned_entries": 0}
        if not self.enabled:
            return nothing

        def measure() -> DiskSizes:
            blocks, pinned = self._store(False), self._store(True)
            return {
                "entries": len(blocks) + len(pinned),
                "bytes": blocks.volume() + pinned.volume(),
                "pinned_entries": len(pinned),
            }

        return self._guarded(measure, nothing)
