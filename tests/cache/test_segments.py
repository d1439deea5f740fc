"""Segments: one file for the file-sized blocks of a store, read back in one pass, each block still its own
row (synthetic payloads, no model)."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from cache import disk_tier, maintenance
from cache.blocks import BlockInfo, PayloadParts
from cache.disk_tier import DiskTier, sweep_segments
from cache.segments import ALIGN, SegmentWriter, can_punch_holes, parse_slice
from tests.cache.disk_reads import read_back
from tests.cache.test_disk_tier import NAMESPACE, TTL, block

SIZE = 40_000  # over the 32 KiB at which a payload leaves its row


# Segments are written only where blocks can be punched out of them; elsewhere the last test here applies.
def _holes_here() -> bool:
    with tempfile.TemporaryDirectory() as folder:
        return can_punch_holes(Path(folder))


needs_holes = pytest.mark.skipif(not _holes_here(), reason="this file system cannot punch holes: no segments here")


def payload(key: int, size: int = SIZE) -> bytes:
    return np.random.default_rng(key).integers(0, 256, size, dtype=np.uint8).tobytes()


def segment_files(folder: Path) -> list[Path]:
    return sorted((folder / "blocks" / "segments").glob("*.seg"))


def filenames(tier: DiskTier) -> dict[str, str | None]:
    rows = tier._store(False)._sql("SELECT key, filename FROM Cache").fetchall()
    return {key: filename for key, filename in rows}


def stored_together(tier: DiskTier, keys: range, size: int = SIZE) -> list[BlockInfo]:
    infos = [block(key, payload(key, size)) for key in keys]
    with tier.storing():
        for info in infos:
            parts = PayloadParts((np.frombuffer(payload(info.key[0], size), dtype=np.uint8),))
            assert tier.put(info, parts)
    return infos


@needs_holes
def test_the_blocks_of_one_store_lie_in_one_file_on_page_boundaries_and_read_back_exactly(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    infos = stored_together(tier, range(1, 6))
    small = block(9, b"s" * 100)
    with tier.storing():
        assert tier.put(small, b"s" * 100)  # a row's own value, as before: no file at all
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
    assert read_back(again, [*infos, small]) == [*(payload(info.key[0]) for info in infos), b"s" * 100]
    again.close()


@needs_holes
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


@needs_holes
def test_a_deleted_block_gives_its_pages_back_and_its_neighbours_stay_intact(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    infos = stored_together(tier, range(1, 6), size=256 * 1024)
    (segment,) = segment_files(tmp_path)
    before = allocated(segment)
    tier.discard(infos[2])
    assert allocated(segment) <= before - 256 * 1024  # ext4, xfs, btrfs and tmpfs punch holes
    assert read_back(tier, infos) == [
        payload(info.key[0], 256 * 1024) if number != 2 else None for number, info in enumerate(infos)
    ]
    tier.close()


@needs_holes
def test_the_budget_culls_a_segments_blocks_one_by_one_least_recent_first(tmp_path: Path) -> None:
    """The budget counts each block's own bytes, as with a file per block: a store of six blocks into a
    budget of four (less the database's pages) keeps the last ones written, and the others' pages are
    punched out of the segment."""
    tier = DiskTier(tmp_path, 4 * SIZE + 20_000, TTL, NAMESPACE)
    infos = stored_together(tier, range(1, 7))
    kept = len(tier.holding(infos))
    assert 2 <= kept <= 4
    assert tier.holding(infos) == {info.key for info in infos[-kept:]}
    assert read_back(tier, infos[-kept:]) == [payload(info.key[0]) for info in infos[-kept:]]
    (segment,) = segment_files(tmp_path)
    assert allocated(segment) <= kept * -(-SIZE // ALIGN) * ALIGN
    tier.close()


def emptied_segment(tier: DiskTier, folder: Path, keys: range) -> Path:
    """The segment of a store whose blocks were all deleted since (its file stays until a sweep)."""
    for info in stored_together(tier, keys):
        tier.discard(info)
    (emptied,) = segment_files(folder)
    return emptied


def age(path: Path) -> None:
    os.utime(path, (time.time() - 3600, time.time() - 3600))


@needs_holes
def test_a_segment_no_row_names_is_swept_when_old_and_one_being_written_is_not(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    emptied = emptied_segment(tier, tmp_path, range(1, 4))
    writer = SegmentWriter(tmp_path / "blocks")  # another process's store under way: no row names it yet
    writer.append([np.frombuffer(payload(7), dtype=np.uint8)])
    store = tier._store(False)
    assert sweep_segments(store) == 0  # both too young to be anyone's leftovers
    age(emptied)
    assert sweep_segments(store) == 1
    assert segment_files(tmp_path) == [writer.path]
    writer.close()
    tier.close()


@needs_holes
def test_a_long_running_process_sweeps_emptied_segments_every_ten_minutes(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    emptied = emptied_segment(tier, tmp_path, range(1, 3))
    age(emptied)
    stored_together(tier, range(3, 5))
    assert emptied in segment_files(tmp_path)  # swept at most every ten minutes
    tier._last_sweep -= 601
    stored_together(tier, range(5, 7))
    assert emptied not in segment_files(tmp_path)
    assert len(segment_files(tmp_path)) == 2
    tier.close()


@needs_holes
def test_a_store_whose_blocks_the_budget_culls_meanwhile_leaves_no_segment(tmp_path: Path) -> None:
    """A store larger than the whole budget: each block culls the one before; at its end no row names its
    segment, and the writer deletes it (nobody else would before the next sweep)."""
    tier = DiskTier(tmp_path, SIZE + 20_000, TTL, NAMESPACE)
    infos = [block(key, payload(key)) for key in range(1, 4)]
    with tier.storing():
        for info in infos:
            tier.put(info, payload(info.key[0]))
            tier.discard(info)  # as a cull or a deletion would, while the store goes on
        assert len(segment_files(tmp_path)) == 1
    assert segment_files(tmp_path) == []
    tier.close()


@needs_holes
def test_a_store_whose_rows_all_fail_leaves_no_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)

    def locked(*_args: object, **_kwargs: object) -> bool:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(tier, "_set", locked)
    info = block(1, payload(1))
    with tier.storing():
        assert not tier.put(info, payload(1))
        assert len(segment_files(tmp_path)) == 1  # written, then no row took it
    assert segment_files(tmp_path) == []
    tier.close()


@needs_holes
def test_clear_and_prune_remove_segments(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    stored_together(tier, range(1, 4))
    tier.close()
    leftover = SegmentWriter(tmp_path / "blocks")  # a store killed before its first row
    leftover.append([np.frombuffer(payload(5), dtype=np.uint8)])
    leftover.close()
    age(leftover.path)
    maintenance.prune(tmp_path)
    assert len(segment_files(tmp_path)) == 1  # the named one stays
    assert maintenance.clear(tmp_path) == 3
    assert segment_files(tmp_path) == []


HEX = "a" * 24


@needs_holes
@pytest.mark.parametrize(
    "name",
    [
        f"segments/{HEX}.seg#4096",
        f"segments/{HEX}.seg#a+5",
        f"segments/{HEX}.seg#²+40000",  # a digit to str.isdigit, not to int()
        f"segments/{HEX}.seg#4097+40000",  # not on a page boundary: would punch a neighbour's page
        f"segments/{HEX}.seg#{'9' * 16}+40000",  # past what a file offset holds
        "{segment}#4096000000000+40000",  # its own segment, far past the file's end: a short read
        f"segments/../{HEX}.seg#0+40000",
        f"/etc/{HEX}.seg#0+40000",
        "segments/x.seg#0+40000",
        "cache.db#0+40000",
    ],
)
def test_a_row_naming_a_slice_badly_is_refused_and_dropped(tmp_path: Path, name: str) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    (info,) = stored_together(tier, range(1, 2))
    (segment,) = segment_files(tmp_path)
    name = name.replace("{segment}", f"segments/{segment.name}")
    tier._store(False)._sql("UPDATE Cache SET filename = ? WHERE key = ?", (name, info.key.hex()))
    assert read_back(tier, [info])[0] is None
    assert tier.holding([info]) == set()  # its row is gone
    tier.close()


@needs_holes
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
    assert read_back(tier, infos) == [None, None, payload(3)]
    tier.close()


def _read_in_child(folder: str, infos: list[BlockInfo], done: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    tier = DiskTier(Path(folder), 1 << 24, TTL, NAMESPACE)
    done.put(read_back(tier, infos))
    tier.close()


@needs_holes
def test_another_process_reads_the_blocks_of_a_segment(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    infos = stored_together(tier, range(1, 5))
    done: multiprocessing.Queue = multiprocessing.get_context("spawn").Queue()  # type: ignore[type-arg]
    child = multiprocessing.get_context("spawn").Process(target=_read_in_child, args=(str(tmp_path), infos, done))
    child.start()
    assert done.get(timeout=60) == [payload(info.key[0]) for info in infos]
    child.join(60)
    tier.close()


def test_where_holes_cannot_be_punched_blocks_get_files_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without hole punching (macOS, some network file systems) a deleted block's bytes, in effect text, would
    stay in its segment as long as any block beside it: there, each block is a file of its own, as before."""
    monkeypatch.setattr("cache.segments._fallocate", lambda: None)
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    infos = stored_together(tier, range(1, 4))
    assert segment_files(tmp_path) == []
    assert all(str(name).endswith(".val") for name in filenames(tier).values())
    assert read_back(tier, infos) == [payload(info.key[0]) for info in infos]
    tier.close()


@pytest.mark.skipif(sys.platform != "linux", reason="hole punching is Linux's fallocate here")
def test_linux_file_systems_punch_holes_so_the_suite_exercises_segments(tmp_path: Path) -> None:
    """ext4, xfs, btrfs and tmpfs all punch holes: where this fails, every segment test above is skipped and
    the stores of the engine tests write a file per block, so the suite must say so."""
    assert can_punch_holes(tmp_path)
    assert not list((tmp_path / "segments").iterdir())  # the probe leaves nothing behind
