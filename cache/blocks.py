"""What the cache knows about a stored block, and the bytes that describe it on disk.

A block record's metadata (keys, position, tokens, payload size and checksum) is small
and travels apart from its KV payload, so the index can be rebuilt at start-up without
reading any KV bytes. Both are plain bytes with a magic, a version and a checksum:
nothing read from disk is ever unpickled.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import xxhash

from cache.keys import BlockKey

META_MAGIC = b"CKVB"
META_VERSION = 1  # a block of full-attention KV (records of this version predate checkpoints)
CHECKPOINT_VERSION = 2  # a checkpoint: the uncuttable sections (SWA window, recurrent state) at one position
# A checkpoint stored as the window cells it adds to another, whose key and payload checksum end
# the record (version 3 had the key only: such deltas are not read, since another process may
# have stored their base again with other bytes).
DELTA_VERSION = 4
_BASE_CHECK = struct.Struct("<Q")
_META_HEAD = struct.Struct(
    "<4sH16s16s16sIIQQ?"
)  # magic, version, namespace, key, parent, start, n_tokens, size, checksum, pinned
_CHECK = struct.Struct("<Q")


def record_namespace(data: bytes) -> bytes | None:
    """The namespace id a stored record names (unchecked: for accounting, never for a restore)."""
    if len(data) < _META_HEAD.size or data[:4] != META_MAGIC:
        return None
    return bytes(data[6:22])


class RecordError(ValueError):
    """A stored record is damaged or from another format version."""


def sort_bytes(tokens: np.ndarray) -> bytes:
    """Tokens as big-endian u32: byte order equals token order, for the sorted children lists."""
    return np.ascontiguousarray(tokens, dtype=">u4").tobytes()


@dataclass(frozen=True)
class PayloadParts:
    """A payload as the flat u8 arrays it is made of, in order (`piece_parts`): hashed and written to a
    file part by part, with no joined copy (for a gigabyte state, one copy of it less)."""

    parts: tuple[np.ndarray, ...]

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self.parts)

    def joined(self) -> bytes:
        return b"".join(part.data for part in self.parts)


def payload_checksum(payload: bytes | memoryview | np.ndarray | PayloadParts) -> int:
    """xxh3-64 of the payload's bytes (of its parts one after another: the same digest as joined)."""
    if isinstance(payload, PayloadParts):
        hasher = xxhash.xxh3_64()
        for part in payload.parts:
            hasher.update(part.data)
        return hasher.intdigest()
    return xxhash.xxh3_64_intdigest(payload.data if isinstance(payload, np.ndarray) else payload)


@dataclass
class BlockInfo:
    """A stored entry: a block, or a checkpoint.

    A block holds the full-attention KV of `tokens`, at positions start..end, after the block
    `parent`. A checkpoint holds the state of the uncuttable sections at position `end`;
    `parent` is then its anchor, the last block boundary at or before `end` (the key of the
    prefix up to `start`), and `tokens` are the prompt tokens between the anchor and `end`.
    A delta checkpoint `extends` an earlier checkpoint on the same tokens: it holds only the
    window cells after that one's end, and restores only while that one is stored.
    """

    key: BlockKey
    parent: BlockKey
    start: int
    tokens: np.ndarray  # int32
    payload_size: int
    checksum: int
    pinned: bool = False
    checkpoint: bool = False
    extends: BlockKey | None = None
    extends_checksum: int = 0  # the payload checksum of the checkpoint it extends, as it was built on
    order_key: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        if not self.order_key:
            self.order_key = sort_bytes(self.tokens)

    @property
    def end(self) -> int:
        return self.start + int(self.tokens.size)

    def encode(self, namespace_id: bytes) -> bytes:
        if self.extends is not None:
            version = DELTA_VERSION
        else:
            version = CHECKPOINT_VERSION if self.checkpoint else META_VERSION
        head = _META_HEAD.pack(
            META_MAGIC,
            version,
            namespace_id,
            self.key,
            self.parent,
            self.start,
            int(self.tokens.size),
            self.payload_size,
            self.checksum,
            self.pinned,
        )
        base = self.extends + _BASE_CHECK.pack(self.extends_checksum) if self.extends is not None else b""
        body = head + np.ascontiguousarray(self.tokens, dtype="<i4").tobytes() + base
        return body + _CHECK.pack(xxhash.xxh3_64_intdigest(body))

    @classmethod
    def decode(cls, data: bytes, namespace_id: bytes) -> BlockInfo:
        """Parse a record; RecordError when it is damaged, foreign or from another version."""
        if len(data) < _META_HEAD.size + _CHECK.size:
            raise RecordError("record too short")
        body, (check,) = data[: -_CHECK.size], _CHECK.unpack(data[-_CHECK.size :])
        if xxhash.xxh3_64_intdigest(body) != check:
            raise RecordError("record checksum mismatch")
        magic, version, namespace, key, parent, start, n_tokens, size, checksum, pinned = _META_HEAD.unpack(
            body[: _META_HEAD.size]
        )
        if magic != META_MAGIC or version not in (META_VERSION, CHECKPOINT_VERSION, DELTA_VERSION):
            raise RecordError("unknown record format")
        if namespace != namespace_id:
            raise RecordError("record from another namespace")
        rest = body[_META_HEAD.size :]
        extends, extends_checksum = None, 0
        if version == DELTA_VERSION:
            base_size = len(key) + _BASE_CHECK.size
            if len(rest) < base_size:
                raise RecordError("delta record without the checkpoint it extends")
            rest, base = rest[:-base_size], rest[-base_size:]
            extends = BlockKey(base[: len(key)])
            (extends_checksum,) = _BASE_CHECK.unpack(base[len(key) :])
        if len(rest) != 4 * n_tokens:
            raise RecordError("record token count mismatch")
        tokens = np.frombuffer(rest, dtype="<i4").astype(np.int32)
        if tokens.size != n_tokens:
            raise RecordError("record token count mismatch")
        checkpoint = version != META_VERSION
        return cls(
            BlockKey(key),
            BlockKey(parent),
            start,
            tokens,
            size,
            checksum,
            pinned,
            checkpoint,
            extends,
            extends_checksum,
        )
