"""Segments: one file for the file-sized blocks of a store, read back in one pass, each block still its own
row (synthetic payloads, no model)."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from cache import disk_tier, maintenance
from cache.blocks import BlockInfo, PayloadParts
from cache.disk_tier import DiskTier, sweep_segments
from cache.segments import ALIGN, SegmentWriter, parse_slice
from tests.cache.test_disk_tier import NAMESPACE, TTL, block

SIZE = 40_000  # over the 32 KiB at which a payload leaves its row


def payload(key: int, size: int = SIZE) -> bytes:
    return np.random.default_rng(key).integers(0, 256, size, dtype=np.uint8).tobytes()


def segment_files(folder: Path) -> list[Path]:
    return sorted((folder / "blocks" / "segments").glob("*.seg"))


def filenames(tier: DiskTier) -> dict[str, str | None]:
    rows = tier._store(False)._sql("SELECT key, filename FROM Cache").fetchall()
    return {key: filename for key, filename in rows}


def stored_together(tier: DiskTier, keys: range, size: int = SIZE) -> list[BlockInfo]:
    infos = [block(key, payload(key, size)) for key in keys]
    with tier.segment() as segment:
        for info in infos:
            parts = PayloadParts((np.frombuffer(payload(info.key[0], size), dtype=np.uint8),))
            assert tier.put(info, parts, segment)
    return infos


def test_the_blocks_of_one_store_lie_in_one_file_on_page_boundaries_and_read_back_exactly(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    infos = stored_together(tier, range(1, 6))
    small = block(9, b"s" * 100)
    with tier.segment() as segment:
        assert tier.put(small, b"s" * 100, segment)  # a row's own value, as before: no file at all
    (only,) = segment_files(tmp_path)
    names = filenames(tier)
    pieces = [parse_slice(str(names[info.key.hex()])) for info in infos]
    assert all(piece is not None and piece.segment == f"segments/{only.name}" for piece in pieces)
    offsets = [piece.offset for piece in pieces if piece is not None]
    assert offsets == sorted(offsets)
    assert all(offset % ALIGN == 0 for offset in offsets)
    assert names[small.key.hex()] is None
    tier.close()
    again = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)  # a new process's view
    assert again.get_many([*infos, small]) == [*(payload(info.key[0]) for info in infos), b"s" * 100]
    again.close()


@pytest.mark.parametrize("threads", [1, 4])
def test_a_restore_opens_a_segment_once_per_reading_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """Twelve blocks in one segment: one thread opens it once and reads on; four open it four times, each
    reading its own run of neighbours. With a file per block it was twelve opens."""
    monkeypatch.setattr("cache.disk_tier.READ_THREADS", threads)
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    infos = stored_together(tier, range(1, 13))
    opened: list[Path] = []
    real_open = disk_tier._open

    def counted(path: Path) -> object:
        opened.append(path)
        return real_open(path)

    monkeypatch.setattr("cache.disk_tier._open", counted)
    seen: dict[int, bytes] = {}
    assert all(tier.read_into(infos[::-1], lambda number, data: seen.update({number: bytes(data)}), keep=False))
    assert seen == {number: payload(info.key[0]) for number, info in enumerate(infos[::-1])}
    assert len(opened) == threads
    assert set(opened) == set(segment_files(tmp_path))
    tier.close()


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_a_deleted_block_gives_its_pages_back_and_its_neighbours_stay_intact(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    infos = stored_together(tier, range(1, 6), size=256 * 1024)
    (segment,) = segment_files(tmp_path)
    before = allocated(segment)
    tier.delete(infos[2])
    assert allocated(segment) <= before - 256 * 1024  # ext4, xfs, btrfs and tmpfs punch holes
    assert tier.get_many(infos) == [
        payload(info.key[0], 256 * 1024) if number != 2 else None for number, info in enumerate(infos)
    ]
    tier.close()


def test_the_budget_culls_a_segments_blocks_one_by_one_least_recent_first(tmp_path: Path) -> None:
    """The budget counts each block's own bytes, as with a file per block: a store of six blocks into a
    budget of four (less the database's pages) keeps the last ones written, and the others' pages are
    punched out of the segment."""
    tier = DiskTier(tmp_path, 4 * SIZE + 20_000, TTL, NAMESPACE)
    infos = stored_together(tier, range(1, 7))
    kept = len(tier.holding(infos))
    assert 2 <= kept <= 4
    assert tier.holding(infos) == {info.key for info in infos[-kept:]}
    assert tier.get_many(infos[-kept:]) == [payload(info.key[0]) for info in infos[-kept:]]
    (segment,) = segment_files(tmp_path)
    assert allocated(segment) <= kept * -(-SIZE // ALIGN) * ALIGN
    tier.close()


def test_a_segment_no_row_names_is_deleted_and_one_being_written_is_not(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    infos = stored_together(tier, range(1, 4))
    for info in infos:
        tier.delete(info)
    (emptied,) = segment_files(tmp_path)
    writer = SegmentWriter(tmp_path / "blocks")  # another process's store under way: no row names it yet
    writer.append([np.frombuffer(payload(7), dtype=np.uint8)])
    store = tier._store(False)
    assert sweep_segments(store) == 0  # both too young to be anyone's leftovers
    os.utime(emptied, (time.time() - 3600, time.time() - 3600))
    assert sweep_segments(store) == 1
    assert segment_files(tmp_path) == [tmp_path / "blocks" / writer._name]
    writer.close()  # no row named it: its writer deletes it
    assert segment_files(tmp_path) == []
    tier.close()


def test_a_store_whose_rows_all_fail_leaves_no_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)

    def locked(*_args: object, **_kwargs: object) -> bool:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(tier, "_set", locked)
    info = block(1, payload(1))
    with tier.segment() as segment:
        assert not tier.put(info, payload(1), segment)
        assert len(segment_files(tmp_path)) == 1  # written, then no row took it
    assert segment_files(tmp_path) == []
    tier.close()


def test_clear_and_prune_remove_segments(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    stored_together(tier, range(1, 4))
    tier.close()
    leftover = SegmentWriter(tmp_path / "blocks")  # a store killed before its first row
    leftover.append([np.frombuffer(payload(5), dtype=np.uint8)])
    os.utime(tmp_path / "blocks" / leftover._name, (time.time() - 3600, time.time() - 3600))
    maintenance.prune(tmp_path)
    assert len(segment_files(tmp_path)) == 1  # the named one stays
    assert maintenance.clear(tmp_path) == 3
    assert segment_files(tmp_path) == []


@pytest.mark.parametrize(
    "name", ["segments/x.seg#12", "segments/x.seg#a+5", "../x.seg#0+40000", "/etc/x.seg#0+40000", "x.val#0+40000"]
)
def test_a_row_naming_a_slice_badly_is_refused_and_dropped(tmp_path: Path, name: str) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    (info,) = stored_together(tier, range(1, 2))
    tier._store(False)._sql("UPDATE Cache SET filename = ? WHERE key = ?", (name, info.key.hex()))
    assert tier.get(info) is None
    assert tier.holding([info]) == set()  # its row is gone
    tier.close()


def test_a_slice_cut_short_or_zeroed_is_never_restored(tmp_path: Path) -> None:
    """A row naming fewer bytes than its record, and a block whose pages another process punched out while
    this one read the row: both fail their checks and are dropped; the neighbours read on."""
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    infos = stored_together(tier, range(1, 4))
    piece = parse_slice(str(filenames(tier)[infos[0].key.hex()]))
    assert piece is not None
    tier._store(False)._sql(
        "UPDATE Cache SET filename = ? WHERE key = ?", (f"{piece.segment}#{piece.offset}+100", infos[0].key.hex())
    )
    with (tmp_path / "blocks" / piece.segment).open("r+b") as segment:
        second = parse_slice(str(filenames(tier)[infos[1].key.hex()]))
        assert second is not None
        segment.seek(second.offset)
        segment.write(bytes(second.size))
    assert tier.get_many(infos) == [None, None, payload(3)]
    tier.close()


def _read_in_child(folder: str, infos: list[BlockInfo], done: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    tier = DiskTier(Path(folder), 1 << 24, TTL, NAMESPACE)
    done.put(tier.get_many(infos))
    tier.close()


def test_another_process_reads_the_blocks_of_a_segment(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    infos = stored_together(tier, range(1, 5))
    done: multiprocessing.Queue = multiprocessing.get_context("spawn").Queue()  # type: ignore[type-arg]
    child = multiprocessing.get_context("spawn").Process(target=_read_in_child, args=(str(tmp_path), infos, done))
    child.start()
    assert done.get(timeout=60) == [payload(info.key[0]) for info in infos]
    child.join(60)
    tier.close()


def test_where_holes_cannot_be_punched_a_culled_segment_goes_once_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a file system without hole punching a culled block's space stays until its whole segment goes:
    the cull deletes a segment none of whose blocks are left, once no store can be appending to it."""
    monkeypatch.setattr("cache.disk_tier.punch", lambda path, piece: None)
    tier = DiskTier(tmp_path, 3 * SIZE + 20_000, TTL, NAMESPACE)
    first = stored_together(tier, range(1, 3))
    (old,) = segment_files(tmp_path)
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    stored_together(tier, range(3, 6))  # the budget culls both blocks of the first store
    assert tier.holding(first) == set()
    assert old not in segment_files(tmp_path)
    young = stored_together(tier, range(6, 9))  # culls the second store's blocks: its segment is too young
    assert len(segment_files(tmp_path)) == 2
    assert tier.get_many(young[-1:]) == [payload(8)]
    tier.close()
