"""The request log: what the cache was asked for and what it stored, to size its tiers from (cache/sizing.py).

Two kinds of record, appended to `requests.log` in the cache folder by every process that uses it:
- a request: when, how many prompt tokens, how many the live context held in place, the most the
  cache could have served (`limit`), what was reused and from which tier, the prefill time, and the
  keys of the prompt's blocks (and of the checkpoints the index knew along it);
- a store: the entries a store added (key, parent, start, tokens, payload bytes).
Keys are the first 8 bytes of the block keys: hashes, sizes and times, never text. Each record is
one `write` to a file opened for appending (so processes do not interleave), framed with a magic,
its length and a checksum: a torn or damaged record is skipped. The log is bounded: past
`max_bytes` the file becomes `requests.log.1` (the older one dropped). It is advice, never a reason
to fail: a write that fails switches the log off for the session.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from cache.keys import BlockKey
from cache.tiers import ReuseTier

log = logging.getLogger(__name__)

LOG_NAME = "requests.log"
OLDER_SUFFIX = ".1"
DEFAULT_MAX_BYTES = 16 << 20  # per file: two files, about 100,000 chat requests of a few thousand tokens
_MAGIC = b"CRL1"
_HEAD = struct.Struct("<4sBIdI")  # magic, kind, body length, time (wall clock, s), session
_CHECK = struct.Struct("<Q")
# prompt, limit, in place, reused, tier, flags (FLAG_*), block size, prefill ms, chain, checkpoints
_REQUEST = struct.Struct("<IIIIBBHfII")
_STORE = struct.Struct("<I")  # entries
_KIND_REQUEST, _KIND_STORE = 1, 2
FLAG_AT_CHECKPOINTS = 1  # the model restores only where a checkpoint is stored (sliding window, recurrent)
FLAG_WITHOUT_BLOCKS = 2  # nor does it store blocks: a checkpoint alone restores (recurrent)
TIER_CODES = {tier: code for code, tier in enumerate(ReuseTier)}
TIERS_BY_CODE = dict(enumerate(ReuseTier))


def short_key(key: BlockKey) -> int:
    """A block key's first 8 bytes as an integer: enough to tell blocks apart in advice (0: the root)."""
    return int.from_bytes(key[:8], "little")


@dataclass(frozen=True)
class LoggedRequest:
    time: float
    session: int
    prompt_tokens: int
    limit: int  # the cache could serve at most this many tokens
    # The live context held this many in place, or a kept whole state gave them: reused whatever the budgets.
    in_place: int
    reused_tokens: int
    tier: ReuseTier
    at_checkpoints: bool  # the model restores only where a checkpoint is stored (sliding window, recurrent)
    block_size: int
    prefill_ms: float  # computing the tokens not reused
    chain: np.ndarray  # uint64 short keys of the prompt's blocks, in order
    checkpoint_keys: np.ndarray  # uint64: checkpoints (or a block matched in part) the index knew along the prompt
    checkpoint_ends: np.ndarray  # uint32: their positions
    without_blocks: bool = False  # a recurrent model: no blocks are stored, a checkpoint alone restores


@dataclass(frozen=True)
class LoggedStore:
    time: float
    session: int
    keys: np.ndarray  # uint64
    parents: np.ndarray  # uint64 (0: the root)
    starts: np.ndarray  # uint32
    tokens: np.ndarray  # uint32
    sizes: np.ndarray  # uint64 payload bytes
    checkpoint: np.ndarray  # bool


LoggedEvent = LoggedRequest | LoggedStore


def encode_request(request: LoggedRequest) -> bytes:
    body = (
        _REQUEST.pack(
            request.prompt_tokens,
            request.limit,
            request.in_place,
            request.reused_tokens,
            TIER_CODES[request.tier],
            FLAG_AT_CHECKPOINTS * request.at_checkpoints + FLAG_WITHOUT_BLOCKS * request.without_blocks,
            request.block_size,
            request.prefill_ms,
            request.chain.size,
            request.checkpoint_keys.size,
        )
        + np.ascontiguousarray(request.chain, dtype="<u8").tobytes()
        + np.ascontiguousarray(request.checkpoint_keys, dtype="<u8").tobytes()
        + np.ascontiguousarray(request.checkpoint_ends, dtype="<u4").tobytes()
    )
    return _frame(_KIND_REQUEST, request.time, request.session, body)


def encode_store(store: LoggedStore) -> bytes:
    body = b"".join(
        [
            _STORE.pack(store.keys.size),
            np.ascontiguousarray(store.keys, dtype="<u8").tobytes(),
            np.ascontiguousarray(store.parents, dtype="<u8").tobytes(),
            np.ascontiguousarray(store.starts, dtype="<u4").tobytes(),
            np.ascontiguousarray(store.tokens, dtype="<u4").tobytes(),
            np.ascontiguousarray(store.sizes, dtype="<u8").tobytes(),
            np.ascontiguousarray(store.checkpoint, dtype=np.uint8).tobytes(),
        ]
    )
    return _frame(_KIND_STORE, store.time, store.session, body)


def _frame(kind: int, when: float, session: int, body: bytes) -> bytes:
    framed = _HEAD.pack(_MAGIC, kind, len(body), when, session) + body
    return framed + _CHECK.pack(xxhash.xxh3_64_intdigest(framed))


class RequestLog:
    """Appends records to a cache folder's log; rotates it past `max_bytes`; never raises."""

    def __init__(self, directory: Path, max_bytes: int = DEFAULT_MAX_BYTES, enabled: bool = True) -> None:
        self.path = directory / LOG_NAME
        self.max_bytes = max_bytes
        self.enabled = enabled and max_bytes > 0
        self.session = random.getrandbits(32)  # tells this process's RAM tier apart from others'

    def append(self, record: bytes) -> None:
        if not self.enabled:
            return
        try:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(descriptor, record)
                if os.fstat(descriptor).st_size > self.max_bytes:
                    self._rotate(descriptor)
            finally:
                os.close(descriptor)
        except OSError as error:
            self.enabled = False
            log.warning("the request log is off for this session (%s): `chatapp cache advise` will see less", error)

    def _rotate(self, descriptor: int) -> None:
        """Make the full log the older one, unless another process rotated it a moment ago."""
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.path).st_ino == os.fstat(descriptor).st_ino:
                os.replace(self.path, self.path.with_name(LOG_NAME + OLDER_SUFFIX))


def log_files(directory: Path) -> list[Path]:
    """The log's files, the older first (only those that exist)."""
    candidates = [directory / (LOG_NAME + OLDER_SUFFIX), directory / LOG_NAME]
    return [path for path in candidates if path.is_file()]


def remove_log(directory: Path) -> None:
    """Forget what was logged (with the cache it described)."""
    for path in log_files(directory):
        path.unlink(missing_ok=True)


@dataclass(frozen=True)
class LogColumns:
    """A log as columns (one row per request, one per store; their entries concatenated, with offsets):
    sizing reads 100,000s of requests without a Python object each."""

    request_time: np.ndarray  # float64
    request_session: np.ndarray  # int64
    prompt: np.ndarray  # int64, and the columns below, one per request
    limit: np.ndarray
    in_place: np.ndarray
    reused: np.ndarray
    tier: np.ndarray  # TIER_CODES
    at_checkpoints: np.ndarray  # bool
    without_blocks: np.ndarray  # bool
    block_size: np.ndarray
    prefill_ms: np.ndarray  # float64
    chain: np.ndarray  # uint64, every request's chain
    chain_offsets: np.ndarray  # int64, requests + 1
    mark_key: np.ndarray  # uint64: checkpoints along each request
    mark_end: np.ndarray  # int64
    mark_offsets: np.ndarray
    store_time: np.ndarray
    store_session: np.ndarray
    entry_key: np.ndarray  # uint64, every store's entries
    entry_size: np.ndarray  # int64
    entry_tokens: np.ndarray  # int64
    entry_parent: np.ndarray  # uint64 (0: the root)
    entry_start: np.ndarray  # int64
    entry_checkpoint: np.ndarray  # bool
    entry_offsets: np.ndarray

    @property
    def requests(self) -> int:
        return int(self.prompt.size)

    def tier_of(self, request: int) -> ReuseTier:
        return TIERS_BY_CODE[int(self.tier[request])]


_REQUEST_ROW = np.dtype(
    [
        ("prompt", "<u4"),
        ("limit", "<u4"),
        ("in_place", "<u4"),
        ("reused", "<u4"),
        ("tier", "u1"),
        ("flags", "u1"),
        ("block_size", "<u2"),
        ("prefill_ms", "<f4"),
        ("chain", "<u4"),
        ("checkpoints", "<u4"),
    ]
)
_HEAD_ROW = np.dtype([("magic", "S4"), ("kind", "u1"), ("length", "<u4"), ("time", "<f8"), ("session", "<u4")])
_CHECK_ROW = np.dtype("<u8")
_FRAME = struct.Struct("<4sxI")  # the head's magic and body length
MAX_REFRAMES = 4  # framings again from inside a damaged record before reading record by record


def read_columns(paths: Sequence[Path]) -> LogColumns:
    """Every intact record of the files as columns (a damaged record is skipped)."""
    return columns_of_bytes(b"".join(path.read_bytes() for path in paths))


def columns_of(events: Sequence[LoggedEvent]) -> LogColumns:
    """The columns of records in memory (tests, and traces turned into logs)."""
    return columns_of_bytes(
        b"".join(encode_request(e) if isinstance(e, LoggedRequest) else encode_store(e) for e in events)
    )


def columns_of_bytes(data: bytes) -> LogColumns:
    """The columns of every intact record in `data`, gathered with numpy (a log holds 100,000s of records:
    a Python object or slice per record would take longer than the sizing itself)."""
    starts = _intact_records(data)
    heads = _rows(data, starts, _HEAD_ROW)
    body = starts + _HEAD.size
    length = heads["length"].astype(np.int64)
    # Requests: the fixed row, then the chain's keys, the checkpoints' keys and their ends.
    is_request = (heads["kind"] == _KIND_REQUEST) & (length >= _REQUEST.size)
    rows = _rows(data, body[is_request], _REQUEST_ROW)
    chain_count = rows["chain"].astype(np.int64)
    mark_count = rows["checkpoints"].astype(np.int64)
    shaped = length[is_request] == _REQUEST.size + 8 * chain_count + 12 * mark_count  # else a later version's
    request_heads, rows = heads[is_request][shaped], rows[shaped]
    chain_count, mark_count = chain_count[shaped], mark_count[shaped]
    keys = body[is_request][shaped] + _REQUEST.size
    # Stores: the count, then the entries' keys, parents, starts, tokens, sizes and checkpoint flags.
    is_store = (heads["kind"] == _KIND_STORE) & (length >= _STORE.size)
    count = _rows(data, body[is_store], np.dtype("<u4")).astype(np.int64)
    shaped = length[is_store] == _STORE.size + 33 * count
    store_heads, count = heads[is_store][shaped], count[shaped]
    entries = body[is_store][shaped] + _STORE.size
    return LogColumns(
        request_heads["time"].astype(np.float64),
        request_heads["session"].astype(np.int64),
        rows["prompt"].astype(np.int64),
        rows["limit"].astype(np.int64),
        rows["in_place"].astype(np.int64),
        rows["reused"].astype(np.int64),
        rows["tier"].astype(np.int64),
        (rows["flags"] & FLAG_AT_CHECKPOINTS).astype(bool),
        (rows["flags"] & FLAG_WITHOUT_BLOCKS).astype(bool),
        rows["block_size"].astype(np.int64),
        rows["prefill_ms"].astype(np.float64),
        _runs(data, keys, chain_count, np.dtype("<u8")),
        _offsets(chain_count),
        _runs(data, keys + 8 * chain_count, mark_count, np.dtype("<u8")),
        _runs(data, keys + 8 * (chain_count + mark_count), mark_count, np.dtype("<u4")).astype(np.int64),
        _offsets(mark_count),
        store_heads["time"].astype(np.float64),
        store_heads["session"].astype(np.int64),
        _runs(data, entries, count, np.dtype("<u8")),
        _runs(data, entries + 24 * count, count, np.dtype("<u8")).astype(np.int64),
        _runs(data, entries + 20 * count, count, np.dtype("<u4")).astype(np.int64),
        _runs(data, entries + 8 * count, count, np.dtype("<u8")),
        _runs(data, entries + 16 * count, count, np.dtype("<u4")).astype(np.int64),
        _runs(data, entries + 32 * count, count, np.dtype("u1")).astype(bool),
        _offsets(count),
    )


def _intact_records(data: bytes) -> np.ndarray:
    """Where each intact record starts. A damaged one (bad magic, torn, checksum wrong) is skipped by
    reading on from the next magic after its start. Runs of framed records are checked at once; where
    the next magic is the next framed record, the run goes on as framed. A magic inside a damaged record
    means framing again from there, over records already framed: past a few of those, record by record
    (so a badly damaged log costs a linear pass, never one pass per damaged record)."""
    starts: list[np.ndarray] = []
    position, reframed = 0, 0
    view = memoryview(data)
    while True:
        run, ends, stop = _framed_run(data, position)
        checks = np.array([xxhash.xxh3_64_intdigest(view[a:b]) for a, b in zip(run, ends, strict=True)], np.uint64)
        kept = checks == _rows(data, np.array(ends, dtype=np.int64), _CHECK_ROW)
        restart: int | None = None
        for wrong in np.flatnonzero(~kept).tolist():
            resync = _next_magic(data, run[wrong] + 1)
            if resync != (run[wrong + 1] if wrong + 1 < len(run) else stop):
                kept[wrong:] = False  # a magic inside the damaged record: frame again from there
                restart = resync
                break
        starts.append(np.array(run, dtype=np.int64)[kept])
        if restart is not None:
            reframed += 1
            if reframed > MAX_REFRAMES:
                starts.append(np.array(_record_by_record(data, restart), dtype=np.int64))
                return np.concatenate(starts)
            position = restart
        elif stop + _HEAD.size + _CHECK.size <= len(data):
            position = _next_magic(data, stop + 1)  # the record at `stop` is not framed right
        else:
            return np.concatenate(starts)


def _record_by_record(data: bytes, position: int) -> list[int]:
    """The intact records' starts from `position` on, each framed and checked in turn."""
    found: list[int] = []
    view = memoryview(data)
    while position + _HEAD.size + _CHECK.size <= len(data):
        run, ends, _ = _framed_run(data, position, most=1)
        if run and xxhash.xxh3_64_intdigest(view[position : ends[0]]) == _CHECK.unpack_from(data, ends[0])[0]:
            found.append(position)
            position = ends[0] + _CHECK.size
        else:
            position = _next_magic(data, position + 1)
    return found


def _framed_run(data: bytes, position: int, most: int | None = None) -> tuple[list[int], list[int], int]:
    """From `position` on, the records whose magic and length hold (where each starts and its checksum
    begins; at most `most` of them), up to where the first that does not starts."""
    starts: list[int] = []
    ends: list[int] = []
    size, head, trailer = len(data), _HEAD.size, _CHECK.size
    unpack = _FRAME.unpack_from
    while position + head + trailer <= size and (most is None or len(starts) < most):
        magic, length = unpack(data, position)
        end = position + head + length
        if magic != _MAGIC or end + trailer > size:
            break
        starts.append(position)
        ends.append(end)
        position = end + trailer
    return starts, ends, position


def _rows(data: bytes, starts: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """One `dtype` item read at each of `starts` (byte offsets into `data`)."""
    if starts.size == 0:
        return np.zeros(0, dtype=dtype)
    raw = np.frombuffer(data, dtype=np.uint8)[starts[:, None] + np.arange(dtype.itemsize)]
    return _native(raw.view(dtype).ravel())


def _runs(data: bytes, starts: np.ndarray, counts: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The `counts[i]` items of `dtype` that begin at byte `starts[i]`, all runs joined in order."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=dtype.newbyteorder("="))
    # A view with an item at every byte offset: a run need not be aligned to its item size.
    every_offset = np.ndarray((len(data) - dtype.itemsize + 1,), dtype=dtype, buffer=data, strides=(1,))
    first = np.repeat(starts - dtype.itemsize * _offsets(counts)[:-1], counts)
    return _native(every_offset[first + dtype.itemsize * np.arange(total)])


def _native(values: np.ndarray) -> np.ndarray:
    """Little-endian on disk; a big-endian machine gets a copy in its own order."""
    if values.dtype.names is not None or values.dtype.isnative:
        return values
    return values.astype(values.dtype.newbyteorder("="))


def _offsets(counts: np.ndarray) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


def _next_magic(data: bytes, start: int) -> int:
    found = data.find(_MAGIC, start)
    return len(data) if found < 0 else found
