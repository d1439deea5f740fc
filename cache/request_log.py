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
    in_place: int  # the live context held this many in place (reused whatever the budgets)
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


def read_columns(paths: Sequence[Path]) -> LogColumns:
    """Every intact record of the files as columns (a damaged record is skipped)."""
    return columns_of_bytes(b"".join(path.read_bytes() for path in paths))


def columns_of(events: Sequence[LoggedEvent]) -> LogColumns:
    """The columns of records in memory (tests, and traces turned into logs)."""
    return columns_of_bytes(
        b"".join(encode_request(e) if isinstance(e, LoggedRequest) else encode_store(e) for e in events)
    )


def columns_of_bytes(data: bytes) -> LogColumns:
    parts = _Parts()
    position = 0
    while position + _HEAD.size + _CHECK.size <= len(data):
        magic, kind, length, _, _ = _HEAD.unpack_from(data, position)
        end = position + _HEAD.size + length
        if magic != _MAGIC or end + _CHECK.size > len(data) or not _intact(data, position, end):
            position = _next_magic(data, position + 1)  # damaged: read on from the next record
            continue
        parts.add(data, kind, position, length)
        position = end + _CHECK.size
    return parts.columns()


class _Parts:
    """The byte runs of each column, gathered record by record and joined once."""

    def __init__(self) -> None:
        self.request_heads: list[bytes] = []
        self.request_rows: list[bytes] = []
        self.chain: list[bytes] = []
        self.mark_keys: list[bytes] = []
        self.mark_ends: list[bytes] = []
        self.chain_counts: list[int] = []
        self.mark_counts: list[int] = []
        self.store_heads: list[bytes] = []
        self.entry_keys: list[bytes] = []
        self.entry_sizes: list[bytes] = []
        self.entry_tokens: list[bytes] = []
        self.entry_parents: list[bytes] = []
        self.entry_starts: list[bytes] = []
        self.entry_flags: list[bytes] = []
        self.entry_counts: list[int] = []

    def add(self, data: bytes, kind: int, start: int, length: int) -> None:
        """One intact record; one of another shape (a later version's) is skipped."""
        body = start + _HEAD.size
        if kind == _KIND_REQUEST and length >= _REQUEST.size:
            *_, chain, marks = _REQUEST.unpack_from(data, body)
            if length != _REQUEST.size + 8 * chain + 12 * marks:
                return
            keys = body + _REQUEST.size
            self.request_heads.append(data[start:body])
            self.request_rows.append(data[body:keys])
            self.chain.append(data[keys : keys + 8 * chain])
            self.mark_keys.append(data[keys + 8 * chain : keys + 8 * (chain + marks)])
            self.mark_ends.append(data[keys + 8 * (chain + marks) : body + length])
            self.chain_counts.append(chain)
            self.mark_counts.append(marks)
        elif kind == _KIND_STORE and length >= _STORE.size:
            (count,) = _STORE.unpack_from(data, body)
            if length != _STORE.size + 33 * count:
                return
            entries = body + _STORE.size
            self.store_heads.append(data[start:body])
            self.entry_keys.append(data[entries : entries + 8 * count])
            self.entry_sizes.append(data[entries + 24 * count : entries + 32 * count])
            self.entry_tokens.append(data[entries + 20 * count : entries + 24 * count])
            self.entry_parents.append(data[entries + 8 * count : entries + 16 * count])
            self.entry_starts.append(data[entries + 16 * count : entries + 20 * count])
            self.entry_flags.append(data[entries + 32 * count : entries + 33 * count])
            self.entry_counts.append(count)

    def columns(self) -> LogColumns:
        heads = _joined(self.request_heads, _HEAD_ROW)
        rows = _joined(self.request_rows, _REQUEST_ROW)
        store_heads = _joined(self.store_heads, _HEAD_ROW)
        return LogColumns(
            heads["time"].astype(np.float64),
            heads["session"].astype(np.int64),
            rows["prompt"].astype(np.int64),
            rows["limit"].astype(np.int64),
            rows["in_place"].astype(np.int64),
            rows["reused"].astype(np.int64),
            rows["tier"].astype(np.int64),
            (rows["flags"] & FLAG_AT_CHECKPOINTS).astype(bool),
            (rows["flags"] & FLAG_WITHOUT_BLOCKS).astype(bool),
            rows["block_size"].astype(np.int64),
            rows["prefill_ms"].astype(np.float64),
            _joined(self.chain, np.dtype("<u8")),
            _offsets(np.array(self.chain_counts, dtype=np.int64)),
            _joined(self.mark_keys, np.dtype("<u8")),
            _joined(self.mark_ends, np.dtype("<u4")).astype(np.int64),
            _offsets(np.array(self.mark_counts, dtype=np.int64)),
            store_heads["time"].astype(np.float64),
            store_heads["session"].astype(np.int64),
            _joined(self.entry_keys, np.dtype("<u8")),
            _joined(self.entry_sizes, np.dtype("<u8")).astype(np.int64),
            _joined(self.entry_tokens, np.dtype("<u4")).astype(np.int64),
            _joined(self.entry_parents, np.dtype("<u8")),
            _joined(self.entry_starts, np.dtype("<u4")).astype(np.int64),
            _joined(self.entry_flags, np.dtype("u1")).astype(bool),
            _offsets(np.array(self.entry_counts, dtype=np.int64)),
        )


def _joined(runs: list[bytes], dtype: np.dtype) -> np.ndarray:
    """The runs as one array, read in place (native order; a big-endian machine gets a copy)."""
    joined = np.frombuffer(b"".join(runs), dtype=dtype)
    return joined if joined.dtype.isnative else joined.astype(joined.dtype.newbyteorder("="))


def _offsets(counts: np.ndarray) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


def _intact(data: bytes, start: int, end: int) -> bool:
    (check,) = _CHECK.unpack_from(data, end)
    return bool(xxhash.xxh3_64_intdigest(data[start:end]) == check)


def _next_magic(data: bytes, start: int) -> int:
    found = data.find(_MAGIC, start)
    return len(data) if found < 0 else found
