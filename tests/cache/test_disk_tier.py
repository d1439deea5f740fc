"""The disk tier under faults: a full or read-only disk, a damaged database, a clock that moves,
hostile rows, two processes (synthetic states, no model)."""

from __future__ import annotations

import errno
import itertools
import multiprocessing
import os
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import diskcache
import numpy as np
import pytest

from cache import disk_tier, maintenance
from cache.blocks import BlockInfo, PayloadParts, payload_checksum
from cache.disk_tier import CLOCK_SLACK_SECONDS, DiskTier
from cache.keys import ROOT_KEY, BlockKey
from tests.cache.disk_reads import read_back
from tests.cache.test_prefix_cache import TOKENS, open_cache, restored_state, store_sequence

NAMESPACE = bytes(16)
TTL = 100.0


class Clock:
    """The wall clock, as diskcache and the tier read it, set by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def block(key: int, payload: bytes, *, pinned: bool = False) -> BlockInfo:
    tokens = np.arange(4, dtype=np.int32) + key
    return BlockInfo(
        BlockKey(key.to_bytes(16, "little")), ROOT_KEY, 0, tokens, len(payload), payload_checksum(payload), pinned
    )


def disk_full(*_args: object, **_kwargs: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_leaves_the_cache_working_in_ram_and_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = open_cache(tmp_path)
    monkeypatch.setattr(diskcache.Cache, "set", disk_full)
    blob = store_sequence(cache, TOKENS)
    state, matched, tier = restored_state(cache, TOKENS)
    assert state == blob
    assert matched == len(TOKENS)
    assert tier == "ram"
    assert cache.disk.enabled is False
    assert "the disk is full" in (cache.problem or "")
    notice = cache.take_notice()
    assert notice is not None
    assert "RAM only" in notice
    assert cache.take_notice() is None  # said once
    store_sequence(cache, [5, 6, 7, 8, 9])  # later stores do not touch the disk nor fail
    assert cache.stats()["disk"]["enabled"] is False
    cache.close()  # no totals written, no error


def test_a_read_only_cache_folder_means_ram_only_from_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(*_args: object, **_kwargs: object) -> None:
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(diskcache.Cache, "__init__", read_only)
    cache = open_cache(tmp_path)
    assert "read-only" in (cache.problem or "")
    blob = store_sequence(cache, TOKENS)
    assert restored_state(cache, TOKENS)[0] == blob
    assert cache.take_notice()
    assert cache.take_notice() is None
    cache.close()


def test_a_damaged_cache_database_is_moved_aside_and_a_new_one_begun(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    store_sequence(cache, TOKENS)
    cache.close()
    (tmp_path / "blocks" / "cache.db").write_bytes(b"this is not sqlite" * 100)
    for extra in ("cache.db-wal", "cache.db-shm"):
        (tmp_path / "blocks" / extra).unlink(missing_ok=True)
    again = open_cache(tmp_path)
    assert len(again.index) == 0
    assert again.disk.enabled
    assert "was damaged" in (again.problem or "")
    assert "moved to blocks.damaged-" in (again.problem or "")
    assert len(list(tmp_path.glob("blocks.damaged-*"))) == 1
    blob = store_sequence(again, TOKENS)
    again.close()
    third = open_cache(tmp_path)
    assert restored_state(third, TOKENS)[0] == blob
    assert third.problem is None
    third.close()
    maintenance.clear(tmp_path)
    assert not list(tmp_path.glob("blocks.damaged-*"))  # clear removes what was set aside


def test_expired_entries_are_never_served_whichever_way_the_clock_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(1_000_000.0)
    monkeypatch.setattr(time, "time", clock)  # diskcache's own clock too
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE, clock=clock)
    payloads = {1: b"a" * 64, 2: b"b" * 64, 3: b"c" * 64}
    fresh, old, later = (block(key, payload) for key, payload in payloads.items())
    for info in (fresh, old, later):
        assert tier.put(info, payloads[info.key[0]])
    assert read_back(tier, [fresh])[0] is not None
    clock.now += TTL + 1  # forward past the TTL: expired
    assert read_back(tier, [old])[0] is None
    assert {info.key for info in tier.new_entries()} == set()
    assert tier.put(later, b"c" * 64)  # stored now, so last used at this time
    clock.now -= 10 * CLOCK_SLACK_SECONDS  # back: an entry used "in the future" has an unknown age
    assert read_back(tier, [later])[0] is None
    assert tier.counters.expirations >= 1
    clock.now += 10 * CLOCK_SLACK_SECONDS  # the clock comes back: the doubtful entry stays gone
    assert read_back(tier, [later])[0] is None
    tier.close()


def test_hostile_rows_are_refused_and_never_unpickled_nor_followed_outside(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"x" * 40_000)
    big, small = block(1, b"p" * 40_000), block(2, b"q" * 100)
    assert tier.put(big, b"p" * 40_000)
    assert tier.put(small, b"q" * 100)
    tier.close()
    with sqlite3.connect(tmp_path / "blocks" / "cache.db") as db:
        db.execute("UPDATE Cache SET filename = ? WHERE key = ?", (str(outside), big.key.hex()))
        db.execute("UPDATE Cache SET raw = 0 WHERE key = ?", (small.key.hex(),))
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    assert read_back(tier, [big])[0] is None
    assert read_back(tier, [small])[0] is None
    assert outside.read_bytes() == b"x" * 40_000  # neither read as a payload nor deleted
    assert {info.key for info in tier.new_entries()} == set()
    tier.close()


@pytest.mark.parametrize("value", ["abc", -5, 1 << 60, 1.5, 100])
def test_an_inline_row_that_holds_no_bytes_is_dropped_not_followed(tmp_path: Path, value: object) -> None:
    """A small payload lives in its row: one whose value is a text or a number is damage, refused like a pickle
    (a number is not taken for that many zero bytes, nor allocated), and the restore goes on."""
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    damaged, intact = block(1, b"v" * 100), block(2, b"w" * 100)
    assert tier.put(damaged, b"v" * 100)
    assert tier.put(intact, b"w" * 100)
    tier.close()
    with sqlite3.connect(tmp_path / "blocks" / "cache.db") as db:
        db.execute("UPDATE Cache SET value = ? WHERE key = ?", (value, damaged.key.hex()))
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    assert read_back(tier, [damaged, intact]) == [None, b"w" * 100]
    assert damaged.key not in access_times(tier)  # dropped
    tier.close()


def test_a_pin_moving_a_block_while_it_is_read_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pins' thread may mark a record pinned between a read's query and its file reads (its copy in the
    pinned store follows): the read uses the store it found the row in, and neither misses nor deletes it."""
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    payload = b"m" * 40_000
    info = block(1, payload)
    assert tier.put(info, payload)
    read_payloads = disk_tier._read_payloads

    def pinned_meanwhile(*args: object, **kwargs: object) -> object:
        info.pinned = True
        return read_payloads(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("cache.disk_tier._read_payloads", pinned_meanwhile)
    assert read_back(tier, [info])[0] == payload
    assert info.key in access_times(tier)  # still in the store it was read from
    tier.close()


def test_deleting_an_unpinned_record_leaves_a_pinned_copy_alone(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    pinned = block(1, b"z" * 64, pinned=True)
    assert tier.put(pinned, b"z" * 64)
    stale = block(1, b"z" * 64)  # another process's out-of-date record of the same block
    tier.discard(stale)
    assert read_back(tier, [pinned])[0] == b"z" * 64
    tier.close()


def test_clear_removes_payload_files_no_row_names_and_prune_only_old_ones(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    store_sequence(cache, TOKENS)
    cache.close()
    orphan = tmp_path / "blocks" / "ab" / "cd" / "orphan.val"  # as a process killed before its commit leaves
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"k" * 50_000)
    maintenance.prune(tmp_path)
    assert orphan.exists()  # young: another process may be about to commit its row
    os.utime(orphan, (time.time() - 3600, time.time() - 3600))
    maintenance.prune(tmp_path)
    assert not orphan.exists()
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"k" * 50_000)
    maintenance.clear(tmp_path)
    assert not orphan.exists()
    assert not list((tmp_path / "blocks").rglob("*.val"))


def _add_totals_many_times(folder: str, times: int) -> None:
    for _ in range(times):
        maintenance.add_totals(Path(folder), {"requests": 1, "ram": {"hits": 2}})


def test_two_processes_adding_totals_at_once_lose_nothing(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_add_totals_many_times, args=(str(tmp_path), 40)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    assert maintenance.read_totals(tmp_path) == {"requests": 80, "ram": {"hits": 160}}


def test_reads_in_one_transaction_keep_their_last_use_and_expiry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore's reads commit once: what each read renews (its TTL) holds after the commit."""
    clock = Clock(1_000_000.0)
    monkeypatch.setattr(time, "time", clock)
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE, clock=clock)
    payloads = {key: bytes([key]) * 40_000 for key in (1, 2, 3)}  # files, as block payloads are
    infos = [block(key, payload) for key, payload in payloads.items()]
    for info in infos:
        assert tier.put(info, payloads[info.key[0]])
    clock.now += TTL * 0.75
    with tier.reading():
        assert [read_back(tier, [info])[0] for info in infos] == list(payloads.values())
    clock.now += TTL * 0.75  # past the first expiry, within the one the reads renewed
    assert [read_back(tier, [info])[0] for info in infos] == list(payloads.values())
    assert tier.enabled


def test_a_failure_inside_the_reads_rolls_back_and_leaves_the_tier_working(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    payload = b"z" * 40_000
    info = block(9, payload)
    assert tier.put(info, payload)

    def failed_restore() -> None:
        with tier.reading():
            assert read_back(tier, [info])[0] == payload
            raise KeyError("the restore failed")

    with pytest.raises(KeyError):
        failed_restore()
    assert tier.enabled
    assert read_back(tier, [info])[0] == payload
    other = block(10, payload)
    assert tier.put(other, payload)  # the database is not left locked
    assert read_back(tier, [other])[0] == payload


def test_a_doubtful_row_read_by_another_thread_does_not_stall_a_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another thread (the pins') has read a damaged row and goes to delete it just as a restore holds the
    database (`reading`): it waits for the restore's commit, and the restore's next read must not wait for
    it in turn (the two would wait forever)."""
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    payload = b"g" * 40_000
    first, second, damaged = block(1, payload), block(2, payload), block(3, payload)
    for info in (first, second, damaged):
        assert tier.put(info, payload)
    damaged.checksum ^= 1  # what the index expects no longer matches the stored bytes
    fetched, began, deleting = threading.Event(), threading.Event(), threading.Event()
    store = tier._store(False)
    original_delete = store.delete

    def checksum(data: bytes) -> int:
        if threading.current_thread().name == "pins":  # read, not yet judged: hold until the restore begins
            fetched.set()
            assert began.wait(60)
        return payload_checksum(data)

    def delete(*args: object, **kwargs: object) -> object:
        deleting.set()  # about to wait for the restore's transaction
        return original_delete(*args, **kwargs)

    monkeypatch.setattr("cache.disk_tier.payload_checksum", checksum)
    monkeypatch.setattr(store, "delete", delete)
    results: dict[str, object] = {}

    def restore() -> None:
        with tier.reading():
            results["first"] = read_back(tier, [first])[0]
            began.set()
            assert deleting.wait(60)
            results["second"] = read_back(tier, [second])[0]

    def pins() -> None:
        results["damaged"] = read_back(tier, [damaged])[0]

    pinning = threading.Thread(target=pins, name="pins")
    pinning.start()
    assert fetched.wait(60)
    restoring = threading.Thread(target=restore, name="restore")
    restoring.start()
    restoring.join(120)
    pinning.join(120)
    assert not restoring.is_alive()
    assert not pinning.is_alive()
    assert results == {"first": payload, "second": payload, "damaged": None}


def access_times(tier: DiskTier) -> dict[bytes, float]:
    rows = tier._store(False)._sql("SELECT key, access_time FROM Cache").fetchall()
    return {bytes.fromhex(key): when for key, when in rows}


def test_a_block_served_from_ram_is_kept_fresh_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refresh renews a row's last use (LRU) and expiry (TTL) as a read would, in the order given (the
    first kept longest), and never brings back a row that expired or is gone."""
    clock = Clock(1_000_000.0)
    monkeypatch.setattr(time, "time", clock)
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE, clock=clock)
    payload = b"r" * 40_000
    first, second, idle, expired = (block(key, payload) for key in (1, 2, 3, 4))
    for info in (expired, first, second, idle):
        assert tier.put(info, payload)
    clock.now += TTL * 0.75
    tier.touch([first, second])
    times = access_times(tier)
    assert times[first.key] > times[second.key] > times[idle.key]
    clock.now += TTL * 0.5  # past the first expiry, within the one the refresh renewed
    assert read_back(tier, [idle])[0] is None
    tier.touch([expired])
    assert read_back(tier, [expired])[0] is None  # expired before the refresh: not revived
    never = block(5, payload)
    tier.touch([never])  # never stored: nothing made
    assert never.key not in access_times(tier)
    assert read_back(tier, [first])[0] == payload
    assert read_back(tier, [second])[0] == payload
    tier.close()


@pytest.mark.parametrize("threads", [1, 3, 4])
def test_a_restore_reads_its_blocks_at_once_as_each_read_alone_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """A batch read gives what single reads give block by block: payloads in files, inline and pinned ones, in the order
    asked; None for a block never stored, one whose file is gone and one whose bytes are damaged (its row
    deleted); and the ones kept marked used in the order given (the first kept longest). With files read
    several at a time, or one at a time."""
    monkeypatch.setattr("cache.disk_tier.READ_THREADS", threads)
    clock = Clock(1_000_000.0)
    monkeypatch.setattr(time, "time", clock)
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE, clock=clock)
    payloads = {key: bytes([key]) * 40_000 for key in (1, 2, 3, 6, 7)}  # files, as block payloads are
    payloads[4] = b"s" * 100  # kept in the database
    payloads[5] = b"p" * 40_000
    first, second, third, inline, pinned, damaged, unfiled = (
        block(key, payloads[key], pinned=key == 5) for key in (1, 2, 3, 4, 5, 6, 7)
    )
    for info in (first, second, third, inline, pinned, damaged, unfiled):
        assert tier.put(info, payloads[info.key[0]])
    damaged.checksum ^= 1
    (filename,) = tier._store(False)._sql("SELECT filename FROM Cache WHERE key = ?", (unfiled.key.hex(),)).fetchone()
    (tmp_path / "blocks" / filename).unlink()
    never = block(8, b"n" * 64)
    clock.now += 10
    asked = [first, inline, pinned, damaged, unfiled, never, second, third]
    assert read_back(tier, asked) == [payloads[1], payloads[4], payloads[5], None, None, None, payloads[2], payloads[3]]
    times = access_times(tier)
    assert times[first.key] > times[inline.key] > times[second.key] > times[third.key] > 1_000_000.0 + 5
    assert damaged.key not in times  # deleted
    assert (tier.counters.hits, tier.counters.misses) == (5, 3)
    assert read_back(tier, []) == []
    tier.close()


def payload_file(tier: DiskTier, info: BlockInfo) -> Path:
    (filename,) = tier._store(False)._sql("SELECT filename FROM Cache WHERE key = ?", (info.key.hex(),)).fetchone()
    return Path(tier._store(False).directory) / str(filename)


@pytest.mark.parametrize("keep", [False, True], ids=["scratch", "kept"])
@pytest.mark.parametrize("threads", [1, 4])
def test_a_restore_hands_each_intact_payload_on_as_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int, keep: bool
) -> None:
    """`read_into` gives the sink each intact payload with its place among those asked: files on the reading
    threads, in new memory when the sink may keep it, else in that thread's reused scratch (one block's size);
    an inline payload comes from its row. A file cut short or grown longer never reaches the sink: False, and
    its row deleted, as in any read."""
    monkeypatch.setattr("cache.disk_tier.READ_THREADS", threads)
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    payloads = {key: bytes([key]) * (40_000 + key) for key in (1, 2, 3, 4, 5)}
    payloads[6] = b"s" * 100  # kept in the database
    infos = {key: block(key, payload) for key, payload in payloads.items()}
    for key, info in infos.items():
        assert tier.put(info, payloads[key])
    with payload_file(tier, infos[3]).open("r+b") as cut:
        cut.truncate(1_000)
    with payload_file(tier, infos[4]).open("ab") as grown:
        grown.write(b"x")
    asked = [infos[key] for key in (1, 6, 3, 4, 2, 5)]
    seen: dict[int, bytes] = {}
    memory: dict[int, np.ndarray] = {}
    lock = threading.Lock()

    def sink(number: int, payload: bytes | memoryview | np.ndarray) -> None:
        with lock:
            seen[number] = bytes(payload)
            if isinstance(payload, np.ndarray):
                memory[number] = payload

    assert tier.read_into(asked, sink, keep=keep) == [True, True, False, False, True, True]
    assert seen == {number: payloads[asked[number].key[0]] for number in (0, 1, 4, 5)}
    files = [memory[number] for number in (0, 4, 5)]
    shared = [np.shares_memory(one, other) for one, other in itertools.combinations(files, 2)]
    if keep:
        assert not any(shared)  # each its own
    elif threads == 1:
        assert all(shared)  # the one thread's scratch, read into again
    assert read_back(tier, [infos[3], infos[4]]) == [None, None]
    assert tier._store(False)._sql(
        "SELECT COUNT(*) FROM Cache WHERE key IN (?, ?)", (infos[3].key.hex(), infos[4].key.hex())
    ).fetchone() == (0,)
    tier.close()


def test_a_restore_reads_as_many_files_at_once_as_it_has_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files of one restore are read READ_THREADS at a time: every read waits at a barrier that only that
    many reads in flight together pass (read one after another, it breaks and they come back None), and the
    reads ran on no more threads than that (not a thread per file). Nine files: three rounds of three."""
    threads = 3
    monkeypatch.setattr("cache.disk_tier.READ_THREADS", threads)
    together = threading.Barrier(threads, timeout=10)
    readers: set[int] = set()
    read_into = disk_tier._read_into

    def at_the_barrier(file: object, source: object, target: np.ndarray) -> np.ndarray | None:
        readers.add(threading.get_ident())
        try:
            together.wait()
        except threading.BrokenBarrierError:
            return None
        return read_into(file, source, target)  # type: ignore[arg-type]

    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    infos = [block(key, bytes([key]) * 40_000) for key in range(1, 10)]
    for info in infos:
        assert tier.put(info, bytes([info.key[0]]) * 40_000)
    monkeypatch.setattr("cache.disk_tier._read_into", at_the_barrier)
    assert read_back(tier, infos) == [bytes([info.key[0]]) * 40_000 for info in infos]
    assert threading.get_ident() not in readers
    assert len(readers) <= threads
    tier.close()


def test_a_restore_reads_when_the_reading_threads_are_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At interpreter exit Python shuts thread pools down before other threads end: a restore then reads its
    files on its own thread instead of failing."""
    gone = ThreadPoolExecutor(2)
    gone.shutdown()
    monkeypatch.setattr("cache.disk_tier._readers", lambda threads: gone)
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    infos = [block(key, bytes([key]) * 40_000) for key in (1, 2, 3)]
    for info in infos:
        assert tier.put(info, bytes([info.key[0]]) * 40_000)
    assert read_back(tier, infos) == [bytes([info.key[0]]) * 40_000 for info in infos]
    tier.close()


def _read_in_child(folder: str, infos: list[BlockInfo], done: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    tier = DiskTier(Path(folder), 1 << 24, TTL, NAMESPACE)
    done.put(read_back(tier, infos))
    tier.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_process_reads_with_threads_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child forked after its parent read from disk on every reading thread reads as well: the parent's
    threads are not in it, and a pool it inherited would count them as there and never run a read."""
    monkeypatch.setattr("cache.disk_tier.READ_THREADS", 2)
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    infos = [block(key, bytes([key]) * 40_000) for key in (1, 2, 3)]
    for info in infos:
        assert tier.put(info, bytes([info.key[0]]) * 40_000)
    expected = [bytes([info.key[0]]) * 40_000 for info in infos]
    together = threading.Barrier(2, timeout=10)
    read_into = disk_tier._read_into

    def at_the_barrier(file: object, source: object, target: np.ndarray) -> np.ndarray | None:
        together.wait()  # both reading threads exist once the two reads pass
        return read_into(file, source, target)  # type: ignore[arg-type]

    monkeypatch.setattr("cache.disk_tier._read_into", at_the_barrier)
    assert read_back(tier, infos[:2]) == expected[:2]
    monkeypatch.setattr("cache.disk_tier._read_into", read_into)
    context = multiprocessing.get_context("fork")
    done = context.Queue()
    child = context.Process(target=_read_in_child, args=(str(tmp_path), infos, done))
    child.start()
    try:
        assert done.get(timeout=30) == expected
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
    tier.close()


def test_a_full_disk_drops_exactly_what_it_must_expired_rows_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over budget, the tier drops expired rows, then the least recently used, until it is within it: one
    block for one block (diskcache alone drops 16 rows at a time, most of a small budget)."""
    clock = Clock(1_000_000.0)
    monkeypatch.setattr(time, "time", clock)
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE, clock=clock)
    payload = b"f" * 40_000
    expired = block(100, payload)
    assert tier.put(expired, payload)
    clock.now += TTL + 1
    infos = [block(key, payload) for key in range(1, 21)]
    for info in infos:
        clock.now += 1
        assert tier.put(info, payload)
    clock.now += 1
    assert read_back(tier, [infos[0]])[0] == payload  # read: now the most recent
    store = tier._store(False)
    store.reset("size_limit", store.volume() + 10_000)  # full: one more block is 30,000 bytes too many
    newer = [block(key, payload) for key in (21, 22)]
    clock.now += 1
    assert tier.put(newer[0], payload)
    kept = set(access_times(tier))
    assert kept == {info.key for info in [*infos, newer[0]]}  # the expired row went, nothing else
    clock.now += 1
    assert tier.put(newer[1], payload)
    assert set(access_times(tier)) == kept - {infos[1].key} | {newer[1].key}  # then the least recently used
    assert store.volume() <= store.size_limit
    tier.close()


def test_small_blocks_kept_in_the_database_are_culled_by_their_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A payload under 32 KiB lives in the database row (diskcache's `size` is 0 for it): the cull counts its
    length, so one more block costs a few of the oldest, never the whole store."""
    clock = Clock(1_000_000.0)
    monkeypatch.setattr(time, "time", clock)
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE, clock=clock)
    payload = b"s" * 5_000
    infos = [block(key, payload) for key in range(1, 41)]
    for info in infos:
        clock.now += 1
        assert tier.put(info, payload)
    store = tier._store(False)
    store.reset("size_limit", store.volume() - 1)
    clock.now += 1
    newest = block(41, payload)
    assert tier.put(newest, payload)
    kept = access_times(tier)
    culled = [info.key for info in infos if info.key not in kept]
    assert newest.key in kept
    assert 1 <= len(culled) <= 4  # the new row's bytes and a page or two of database
    assert culled == [info.key for info in infos[: len(culled)]]  # the least recently used


def test_a_block_larger_than_the_whole_budget_is_refused_not_kept_at_the_cost_of_everything(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 400_000, TTL, NAMESPACE)
    payload = b"k" * 40_000
    infos = [block(key, payload) for key in range(1, 6)]
    for info in infos:
        assert tier.put(info, payload)
    huge = block(9, b"h" * 500_000)
    assert not tier.put(huge, b"h" * 500_000)
    assert set(access_times(tier)) == {info.key for info in infos}
    assert tier.enabled
    tier.close()


@pytest.mark.parametrize("sizes", [(40_000, 9_000, 70_000), (100, 200, 300)])  # a file / a database row
def test_a_payload_stored_as_parts_reads_back_as_their_bytes_joined(tmp_path: Path, sizes: tuple[int, ...]) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    rng = np.random.default_rng(5)
    parts = PayloadParts(tuple(rng.integers(0, 256, size, dtype=np.uint8) for size in sizes))
    joined = parts.joined()
    assert payload_checksum(parts) == payload_checksum(joined)  # hashed part by part: the same digest
    info = block(7, joined)
    assert tier.put(info, parts)
    assert read_back(tier, [info])[0] == joined
    assert tier.counters.bytes_written == len(joined)
    tier.close()


def test_a_payload_file_that_could_not_be_written_whole_is_not_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = DiskTier(tmp_path, 1 << 24, TTL, NAMESPACE)
    written: list[str] = []
    real_open = open

    def fails_after_the_first_part(path: str, mode: str) -> object:
        writer = real_open(path, mode)
        written.append(path)
        real_write, calls = writer.write, itertools.count()
        writer.write = lambda data: real_write(data) if next(calls) == 0 else disk_full()  # type: ignore[method-assign, assignment]
        return writer

    monkeypatch.setattr(disk_tier, "open", fails_after_the_first_part, raising=False)
    parts = PayloadParts((np.ones(50_000, dtype=np.uint8), np.zeros(50_000, dtype=np.uint8)))
    assert not tier.put(block(8, parts.joined()), parts)
    assert written
    assert not os.path.exists(written[0])
    assert "the disk is full" in (tier.problem or "")
    tier.close()
