"""Block and checkpoint records: plain bytes with a version, refused when damaged or foreign."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import xxhash

from cache.blocks import CHECKPOINT_VERSION, DELTA_VERSION, META_VERSION, BlockInfo, RecordError
from cache.keys import BlockKey

NAMESPACE = bytes(range(16))


def record(checkpoint: bool, tokens: list[int] | None = None) -> BlockInfo:
    return BlockInfo(
        BlockKey(b"k" * 16),
        BlockKey(b"p" * 16),
        8,
        np.asarray([5, 6, 7] if tokens is None else tokens, dtype=np.int32),
        1234,
        0xDEADBEEF,
        pinned=True,
        checkpoint=checkpoint,
    )


@pytest.mark.parametrize("checkpoint", [False, True], ids=["block", "checkpoint"])
def test_records_round_trip(checkpoint: bool) -> None:
    info = record(checkpoint)
    data = info.encode(NAMESPACE)
    (version,) = struct.unpack_from("<H", data, 4)
    assert version == (CHECKPOINT_VERSION if checkpoint else META_VERSION)
    decoded = BlockInfo.decode(data, NAMESPACE)
    assert decoded.checkpoint is checkpoint
    assert (decoded.key, decoded.parent, decoded.start, decoded.end) == (info.key, info.parent, 8, 11)
    assert decoded.tokens.tolist() == [5, 6, 7]
    assert (decoded.payload_size, decoded.checksum, decoded.pinned) == (1234, 0xDEADBEEF, True)
    assert decoded.order_key == info.order_key


def test_a_delta_checkpoint_names_the_checkpoint_it_extends_and_its_bytes() -> None:
    info = record(True)
    info.extends = BlockKey(b"e" * 16)
    info.extends_checksum = 0xFEEDFACE
    data = info.encode(NAMESPACE)
    assert struct.unpack_from("<H", data, 4) == (DELTA_VERSION,)
    decoded = BlockInfo.decode(data, NAMESPACE)
    assert decoded.checkpoint
    assert decoded.extends == b"e" * 16
    assert decoded.extends_checksum == 0xFEEDFACE
    assert decoded.tokens.tolist() == [5, 6, 7]
    assert BlockInfo.decode(record(True).encode(NAMESPACE), NAMESPACE).extends is None
    # A delta record cut short of its base (checksum recomputed) is refused, never misread.
    body = data[:-8][:-24]
    with pytest.raises(RecordError, match=r"token count|without the checkpoint"):
        BlockInfo.decode(body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body)), NAMESPACE)
    # A delta of the older format, which did not pin its base's bytes down, is not read.
    old = bytearray(data[:-8][:-8])
    struct.pack_into("<H", old, 4, DELTA_VERSION - 1)
    with pytest.raises(RecordError, match="unknown record format"):
        BlockInfo.decode(bytes(old) + struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(old))), NAMESPACE)


def test_a_checkpoint_at_a_block_boundary_has_no_tokens() -> None:
    info = record(True, [])
    decoded = BlockInfo.decode(info.encode(NAMESPACE), NAMESPACE)
    assert decoded.checkpoint
    assert decoded.tokens.size == 0
    assert decoded.end == decoded.start == 8


def test_damaged_foreign_and_unknown_records_are_refused() -> None:
    data = record(True).encode(NAMESPACE)
    with pytest.raises(RecordError, match="namespace"):
        BlockInfo.decode(data, bytes(16))
    with pytest.raises(RecordError, match="checksum"):
        BlockInfo.decode(data[:10] + bytes([data[10] ^ 1]) + data[11:], NAMESPACE)
    with pytest.raises(RecordError, match="short"):
        BlockInfo.decode(data[:20], NAMESPACE)
    # A version this code does not know, with a valid checksum.
    body = data[:4] + struct.pack("<H", DELTA_VERSION + 1) + data[6:-8]
    with pytest.raises(RecordError, match="unknown"):
        BlockInfo.decode(body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body)), NAMESPACE)
