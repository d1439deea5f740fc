"""The request log: records read back as columns, damage skipped, bounded by rotation, never a failure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cache.request_log import (
    _CHECK,
    _HEAD,
    LOG_NAME,
    LoggedRequest,
    LoggedStore,
    RequestLog,
    _frame,
    columns_of_bytes,
    encode_request,
    encode_store,
    log_files,
    read_columns,
    remove_log,
)
from cache.tiers import ReuseTier


def request(when: float, chain: list[int], marks: list[tuple[int, int]] = ()) -> LoggedRequest:  # type: ignore[assignment]
    return LoggedRequest(
        when,
        7,
        64 * len(chain) - 3,
        64 * len(chain) - 5,
        64,
        100,
        ReuseTier.DISK,
        bool(marks),
        64,
        12.5,
        np.array(chain, dtype=np.uint64),
        np.array([key for key, _ in marks], dtype=np.uint64),
        np.array([end for _, end in marks], dtype=np.uint32),
    )


def store(when: float, keys: list[int], checkpoint: list[bool]) -> LoggedStore:
    count = len(keys)
    return LoggedStore(
        when,
        9,
        np.array(keys, dtype=np.uint64),
        np.zeros(count, dtype=np.uint64),
        np.arange(count, dtype=np.uint32) * 64,
        np.full(count, 64, dtype=np.uint32),
        np.array([1000 * (index + 1) for index in range(count)], dtype=np.uint64),
        np.array(checkpoint, dtype=bool),
    )


def test_records_read_back_as_columns() -> None:
    data = b"".join(
        [
            encode_request(request(1.0, [2**63 + 5, 6, 7])),
            encode_store(store(2.0, [6, 2**64 - 1], [False, True])),
            encode_request(request(3.0, [8], [(11, 70), (12, 90)])),
        ]
    )
    log = columns_of_bytes(data)
    assert log.requests == 2
    assert log.request_time.tolist() == [1.0, 3.0]
    assert log.prompt.tolist() == [64 * 3 - 3, 64 - 3]
    assert log.limit.tolist() == [64 * 3 - 5, 64 - 5]
    assert log.in_place.tolist() == [64, 64]
    assert log.reused.tolist() == [100, 100]
    assert log.tier_of(0) is ReuseTier.DISK
    assert log.at_checkpoints.tolist() == [False, True]
    assert log.prefill_ms.tolist() == [12.5, 12.5]
    assert log.chain.tolist() == [2**63 + 5, 6, 7, 8]
    assert log.chain_offsets.tolist() == [0, 3, 4]
    assert log.mark_key.tolist() == [11, 12]
    assert log.mark_end.tolist() == [70, 90]
    assert log.mark_offsets.tolist() == [0, 0, 2]
    assert log.store_time.tolist() == [2.0]
    assert log.entry_key.tolist() == [6, 2**64 - 1]
    assert log.entry_size.tolist() == [1000, 2000]
    assert log.entry_checkpoint.tolist() == [False, True]
    assert log.entry_offsets.tolist() == [0, 2]


def test_a_damaged_record_is_skipped_and_the_next_one_read() -> None:
    first, second, third = (encode_request(request(float(n), [n + 1])) for n in range(3))
    damaged = bytearray(second)
    damaged[30] ^= 0xFF  # inside the body: the checksum no longer matches
    torn = third[: len(third) // 2]  # a process killed mid-write
    log = columns_of_bytes(first + bytes(damaged) + b"\x00garbage" + third + torn)
    assert log.request_time.tolist() == [0.0, 2.0]


def test_the_log_rotates_past_its_bound_and_is_removed_with_the_cache(tmp_path: Path) -> None:
    record = encode_request(request(1.0, list(range(1, 40))))
    log = RequestLog(tmp_path, max_bytes=3 * len(record))
    for _ in range(5):
        log.append(record)
    files = log_files(tmp_path)
    assert [path.name for path in files] == [LOG_NAME + ".1", LOG_NAME]
    assert sum(path.stat().st_size for path in files) == 5 * len(record)  # rotated after the 4th: nothing lost yet
    assert read_columns(files).requests == 5
    assert (tmp_path / LOG_NAME).stat().st_mode & 0o777 == 0o600
    remove_log(tmp_path)
    assert log_files(tmp_path) == []


def test_a_log_that_cannot_be_written_switches_itself_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    log = RequestLog(blocker)
    log.append(encode_request(request(1.0, [1])))  # no exception
    assert not log.enabled
    assert "request log is off" in caplog.text


def test_records_of_a_later_version_are_skipped_and_those_after_them_read() -> None:
    """A kind this version does not know, or a request longer than its counts say, is intact but not read."""
    first, last = encode_request(request(1.0, [5, 6])), encode_store(store(4.0, [7], [False]))
    unknown_kind = _frame(9, 2.0, 7, b"\x01" * 40)
    body = encode_request(request(3.0, [8]))[_HEAD.size : -_CHECK.size]
    longer = _frame(1, 3.0, 7, body + b"\x00" * 8)  # the same request with 8 bytes its counts do not name
    log = columns_of_bytes(first + unknown_kind + longer + last)
    assert log.request_time.tolist() == [1.0]
    assert log.chain.tolist() == [5, 6]
    assert log.store_time.tolist() == [4.0]
    assert log.entry_key.tolist() == [7]


def test_many_damaged_records_holding_a_magic_are_skipped_record_by_record() -> None:
    """Past a few damaged records with a magic inside (framing must start again there), the rest of the
    log is read record by record: the same records as ever, in one pass."""
    magic_key = int.from_bytes(b"xxCRL1xx", "little")
    good = [encode_request(request(float(n), [n + 1])) for n in range(12)]
    damaged = []
    for n in range(12):
        record = bytearray(encode_request(request(100.0 + n, [magic_key, n + 1])))
        record[-1] ^= 0xFF  # its checksum no longer matches
        damaged.append(bytes(record))
    log = columns_of_bytes(b"".join(part for pair in zip(good, damaged, strict=True) for part in pair))
    assert log.request_time.tolist() == [float(n) for n in range(12)]
