"""The prefix cache on synthetic states: store, find, fetch, survive a restart, refuse damage."""

from __future__ import annotations

import pickle
import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cache.memory_kinds import MemoryKind, PlainMemory, memory_of
from cache.namespace import Namespace
from cache.prefix_cache import CacheConfig, FetchedPrefix, PrefixCache
from cache.state_assembly import assemble_state
from cache.state_format import MemoryLayout, extract_piece, parse_state
from tests.cache.damage import flip_two_bytes, truncate
from tests.cache.state_factory import make_state, small_layout

KV_LAYOUT = small_layout(v_trans=False, scale=512)  # pieces over 32 KiB: stored as files
LAYOUT = MemoryLayout(PlainMemory(), KV_LAYOUT, None, 0)
CONFIG = CacheConfig(block_size=4, ram_budget_bytes=1 << 20, disk_budget_bytes=1 << 24, ttl_seconds=3600)


def namespace(model: str = "model-a", type_k: int = 1) -> Namespace:
    return Namespace(model, type_k, 1, True, CONFIG.block_size, "0.3.36", layout_digest=LAYOUT.digest().hex())


def open_cache(folder: Path, space: Namespace | None = None) -> PrefixCache:
    return PrefixCache(folder, space or namespace(), LAYOUT, CONFIG)


def store_sequence(cache: PrefixCache, tokens: list[int], seed: int = 0) -> bytes:
    blob, _ = make_state(KV_LAYOUT, list(range(len(tokens))), seq_id=0, stream=0, seed=seed)
    cache.store(tokens, np.frombuffer(blob, dtype=np.uint8))
    cache.flush()
    return blob


def restored_state(cache: PrefixCache, prompt: list[int]) -> tuple[bytes, int, str]:
    found = cache.lookup(np.asarray(prompt))
    assert found.checkpoint is None  # plain models need none
    fetched = cache.fetch(found, np.asarray(prompt))
    assert fetched is not None
    assert fetched.prompt_tokens == tuple(prompt[: fetched.tokens])
    cache.flush()
    return fetched.state.tobytes(), fetched.tokens, fetched.tier


TOKENS = list(range(100, 111))  # 11 tokens: blocks of 4, 4 and a partial 3


def test_a_stored_sequence_comes_back_byte_for_byte(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    blob = store_sequence(cache, TOKENS)
    state, matched, tier = restored_state(cache, [*TOKENS, 999])
    assert state == blob
    assert matched == 11
    assert tier == "ram"
    cache.close()


def test_after_a_restart_blocks_come_from_disk(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    blob = store_sequence(cache, TOKENS)
    cache.close()
    again = open_cache(tmp_path)
    assert len(again.index) == 3  # rebuilt from the records alone
    state, matched, tier = restored_state(again, TOKENS)
    assert state == blob
    assert matched == 11
    assert tier == "disk"
    assert restored_state(again, TOKENS)[2] == "ram"  # promoted
    again.close()


def fetched_from_disk(cache: PrefixCache, prompt: list[int], *, keep_blocks: bool = True) -> FetchedPrefix:
    found = cache.lookup(np.asarray(prompt))
    fetched = cache.fetch(found, np.asarray(prompt), keep_blocks=keep_blocks)
    assert fetched is not None
    assert fetched.tier == "disk"
    return fetched


def test_ram_keeps_the_memory_blocks_were_read_into_from_disk(tmp_path: Path) -> None:
    """A restore reads each disk block into memory of its own, copies it into the state and hands it to RAM as
    it is (read-only): no second copy. Without `keep_blocks` (a caller that keeps the whole state instead) the
    blocks go through the reader's scratch and RAM keeps none of them; the state is the same."""
    cache = open_cache(tmp_path)
    blob = store_sequence(cache, TOKENS)
    cache.ram.clear()
    skipped = fetched_from_disk(cache, TOKENS, keep_blocks=False)
    assert skipped.state.tobytes() == blob
    assert not any(info.key in cache.ram for info in skipped.blocks)
    kept = fetched_from_disk(cache, TOKENS)
    assert kept.state.tobytes() == blob
    payloads = [cache.ram.get(info.key, info.checksum) for info in kept.blocks]
    assert all(isinstance(payload, np.ndarray) and not payload.flags.writeable for payload in payloads)
    expected = [blob_piece(blob, info.start, info.end) for info in kept.blocks]
    assert [bytes(payload) for payload in payloads if payload is not None] == expected
    again = cache.fetch(cache.lookup(np.asarray(TOKENS)), np.asarray(TOKENS))
    assert again is not None
    assert again.tier == "ram"
    assert again.state.tobytes() == blob
    cache.close()


def test_a_block_pinned_before_it_is_read_from_disk_stays_pinned_in_ram(tmp_path: Path) -> None:
    """RAM keeps a block read from disk as the index holds it now: a pinned one as pinned (never evicted)."""
    cache = open_cache(tmp_path)
    store_sequence(cache, TOKENS)
    assert cache.pin(TOKENS) == 3
    cache.ram.clear()
    fetched = fetched_from_disk(cache, TOKENS)
    assert all(cache.ram._slots[info.key].pinned for info in fetched.blocks)
    cache.close()


def test_shared_prefixes_are_stored_once_and_partials_superseded(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    store_sequence(cache, TOKENS[:6])  # one full block, one partial of 2
    store_sequence(cache, TOKENS)  # the same prefix, longer: the partial is superseded
    store_sequence(cache, [*TOKENS[:8], 7, 7, 7])  # shares two full blocks
    sizes = sorted(info.tokens.size for info in cache.index.entries.values())
    assert sizes == [3, 3, 4, 4]
    cache.close()


def test_a_namespace_without_a_batch_rule_keeps_the_keys_it_had() -> None:
    canonical = namespace("model-a").canonical()
    for optional in ("batch_rows", "window_cells", "device"):
        assert optional not in canonical
    assert replace(namespace("model-a"), batch_rows=64).id != namespace("model-a").id
    # A window cache of another size lays its cells out otherwise (and so rounds otherwise); so does a device.
    assert replace(namespace("model-a"), window_cells=1024).id != replace(namespace("model-a"), window_cells=4096).id
    assert replace(namespace("model-a"), device="Vulkan0").id != namespace("model-a").id


def test_namespaces_never_share_entries(tmp_path: Path) -> None:
    first = open_cache(tmp_path, namespace("model-a"))
    store_sequence(first, TOKENS)
    first.close()
    batch_rule = replace(namespace("model-a"), batch_rows=64)  # flash attention's batches of 64+
    for other in (namespace("model-b"), namespace("model-a", type_k=8), batch_rule):
        cache = open_cache(tmp_path, other)
        assert len(cache.index) == 0
        assert cache.lookup(np.asarray(TOKENS)).tokens == 0
        cache.close()


@pytest.mark.parametrize("damage", [flip_two_bytes, truncate], ids=["flipped", "truncated"])
@pytest.mark.parametrize("block", [0, 1])
def test_a_damaged_payload_is_dropped_and_never_restored(tmp_path: Path, damage, block: int) -> None:
    cache = open_cache(tmp_path)
    blob = store_sequence(cache, TOKENS)
    stored = cache.lookup(np.asarray(TOKENS)).blocks
    cache.close()
    damage(tmp_path, stored[block].key)
    again = open_cache(tmp_path)
    fetched = again.fetch(again.lookup(np.asarray(TOKENS)), np.asarray(TOKENS))
    if block == 0:
        assert fetched is None  # nothing before the damage to restore
    else:  # the intact first block only, byte for byte
        assert fetched is not None
        assert [b.key for b in fetched.blocks] == [stored[0].key]
        assert fetched.tokens == 4
        assert fetched.state.tobytes() == assemble_state(LAYOUT, [(4, blob_piece(blob, 0, 4))], 0).tobytes()
    assert stored[block].key not in again.index  # dropped, so it is recomputed next time
    again.close()


def blob_piece(blob: bytes, start: int, end: int) -> bytes:
    base = parse_state(blob, memory_of(MemoryKind.PLAIN)).base
    assert base is not None
    return extract_piece(base, base.order()[0], start, end)


def test_pickled_values_are_refused(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    store_sequence(cache, TOKENS)
    cache.close()
    database = sqlite3.connect(tmp_path / "blocks" / "cache.db")
    database.execute("UPDATE Cache SET mode = 4, filename = NULL, value = ?", (pickle.dumps(b"x"),))
    database.commit()
    database.close()
    again = open_cache(tmp_path)
    assert again.fetch(again.lookup(np.asarray(TOKENS)), np.asarray(TOKENS)) is None
    again.close()


def test_pinned_blocks_survive_clearing_pressure_and_stats_count(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    store_sequence(cache, TOKENS)
    assert cache.pin(TOKENS) == 3
    assert all(info.pinned for info in cache.index.entries.values())
    restored_state(cache, TOKENS)
    stats = cache.stats()
    assert stats["pinned_entries"] == 3
    assert stats["ram"]["hits"] >= 3
    assert stats["disk"]["entries"] == 3
    assert stats["disk"]["pinned_entries"] == 3
    cache.close()
    again = open_cache(tmp_path)
    assert all(info.pinned for info in again.index.entries.values())
    assert len(again.index) == 3
    assert again.clear() == 3
    assert len(again.index) == 0
    again.close()


def test_cache_folders_are_private(tmp_path: Path) -> None:
    cache = open_cache(tmp_path / "kv")
    store_sequence(cache, TOKENS)
    cache.close()
    assert (tmp_path / "kv").stat().st_mode & 0o077 == 0
    assert (tmp_path / "kv" / "blocks").stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("bad_tokens", [[], [5]])
def test_tiny_sequences_store_and_miss_cleanly(tmp_path: Path, bad_tokens: list[int]) -> None:
    cache = open_cache(tmp_path)
    if bad_tokens:
        store_sequence(cache, bad_tokens)
        assert cache.lookup(np.asarray([*bad_tokens, 1])).tokens == 1
        assert restored_state(cache, [*bad_tokens, 1])[1] == 1
    assert cache.lookup(np.asarray([42, 43])).tokens == 0
    assert cache.fetch(cache.lookup(np.asarray([42, 43])), np.asarray([42, 43])) is None
    cache.close()


def test_a_state_whose_cells_do_not_start_at_zero_is_not_stored(tmp_path: Path) -> None:
    """Cells 3..13 would be stored as if they were the prompt's first eleven: a wrong restore."""
    cache = open_cache(tmp_path)
    shifted, _ = make_state(KV_LAYOUT, list(range(3, 3 + len(TOKENS))), seq_id=0, stream=0)
    cache.store(TOKENS, np.frombuffer(shifted, dtype=np.uint8))
    cache.flush()
    assert cache.lookup(np.asarray([*TOKENS, 999])).tokens == 0
    store_sequence(cache, TOKENS)
    assert cache.lookup(np.asarray([*TOKENS, 999])).tokens == len(TOKENS)
    cache.close()


def test_a_cache_open_in_another_process_finds_what_this_one_stores(tmp_path: Path) -> None:
    reader = open_cache(tmp_path)  # opened first, as a running server would be
    writer = open_cache(tmp_path)
    assert reader.lookup(np.asarray([*TOKENS, 999])).tokens == 0
    blob = store_sequence(writer, TOKENS)
    state, matched, tier = restored_state(reader, [*TOKENS, 999])
    assert (state, matched, tier) == (blob, 11, "disk")
    # Emptied by the other process (rowids start again), then stored again: the new records are read.
    writer.clear()
    again = store_sequence(writer, TOKENS, seed=1)
    # The reader's RAM still holds the first bytes under the same keys: never served for the new records.
    assert restored_state(reader, [*TOKENS, 999]) == (again, 11, "disk")
    writer.close()
    reader.close()


def test_unpinning_a_prefix_leaves_pinned_what_an_overlapping_pin_holds(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    other = [*TOKENS[:8], *range(300, 305)]  # the first two blocks shared with TOKENS, then its own
    store_sequence(cache, TOKENS)
    store_sequence(cache, other)
    assert cache.pin(TOKENS) == 3
    assert cache.pin(other) == 4  # its first two blocks were pinned already
    assert cache.pin(TOKENS, pinned=False, keep=[other]) == 1  # only its third block was its own
    pinned = sorted((info.start, info.tokens.size) for info in cache.index.entries.values() if info.pinned)
    assert pinned == [(0, 4), (4, 4), (8, 4), (12, 1)]
    assert cache.stats()["disk"]["pinned_entries"] == 4
    assert cache.pin(other, pinned=False) == 4
    assert not any(info.pinned for info in cache.index.entries.values())
    cache.close()


def test_pinning_stops_at_a_lost_block(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    store_sequence(cache, TOKENS)
    second = next(info for info in cache.index.entries.values() if info.start == 4)
    cache.ram.discard(second)
    cache.disk.discard(second)
    assert cache.pin(TOKENS) == 1  # the first block; nothing after the lost one can be restored
    cache.close()


def test_the_lru_tiers_evict_a_prefix_from_its_last_block(tmp_path: Path) -> None:
    """Stores and restores touch a prefix deepest first, so its first blocks are the most recent: under
    pressure LRU drops the last block (the rest still restores), never the first (which strands the rest)."""
    sizing = open_cache(tmp_path / "sizing")
    store_sequence(sizing, TOKENS)
    sizes = [info.payload_size for info in sizing.lookup(np.asarray(TOKENS)).blocks]
    sizing.close()
    config = replace(CONFIG, eviction_policy="lru", ram_budget_bytes=sizes[0] + sizes[1] + sizes[2] // 2)
    cache = PrefixCache(tmp_path / "tight", namespace(), LAYOUT, config)
    store_sequence(cache, TOKENS)
    blocks = cache.lookup(np.asarray(TOKENS)).blocks
    assert [info.key in cache.ram for info in blocks] == [True, True, False]
    _, matched, tier = restored_state(cache, TOKENS)
    assert (matched, tier) == (11, "disk")  # the last block came from disk
    times = {
        bytes.fromhex(key): when
        for key, when in cache.disk._store(False)._sql("SELECT key, access_time FROM Cache").fetchall()
    }
    first, second, last = (times[info.key] for info in blocks)
    assert first > second > last  # the restore read them deepest first
    cache.close()


def test_a_prefix_read_from_disk_is_kept_longest_from_its_first_block(tmp_path: Path) -> None:
    """Every block of a prefix read from disk: the disk marks the first one used last (kept longest), and RAM
    keeps them all, the first one evicted last."""
    cache = open_cache(tmp_path)
    store_sequence(cache, TOKENS)
    blocks = cache.lookup(np.asarray(TOKENS)).blocks
    cache.ram.clear()
    _, matched, tier = restored_state(cache, TOKENS)
    assert (matched, tier) == (11, "disk")
    times = {
        bytes.fromhex(key): when
        for key, when in cache.disk._store(False)._sql("SELECT key, access_time FROM Cache").fetchall()
    }
    first, second, last = (times[info.key] for info in blocks)
    assert first > second > last
    assert cache.ram.policy.victim() == blocks[-1].key
    cache.close()


def test_blocks_kept_in_the_database_row_come_back_to_ram_too(tmp_path: Path) -> None:
    """Blocks under diskcache's file size live in their row: read from disk, RAM keeps them as well."""
    inline = small_layout(v_trans=False)  # pieces of a few hundred bytes
    layout = MemoryLayout(PlainMemory(), inline, None, 0)
    cache = PrefixCache(tmp_path, namespace(), layout, CONFIG)
    blob, _ = make_state(inline, list(range(len(TOKENS))), seq_id=0, stream=0)
    cache.store(TOKENS, np.frombuffer(blob, dtype=np.uint8))
    cache.flush()
    cache.ram.clear()
    for tier in ("disk", "ram"):
        fetched = cache.fetch(cache.lookup(np.asarray(TOKENS)), np.asarray(TOKENS))
        assert fetched is not None
        assert (fetched.state.tobytes(), fetched.tier) == (blob, tier)
    cache.close()


def test_a_prefix_restored_from_ram_stays_fresh_on_disk(tmp_path: Path) -> None:
    """Restores from RAM refresh the disk's copies (on the writer thread), first block newest: a prefix used
    from RAM every day is still on disk at the next start."""
    cache = open_cache(tmp_path)
    store_sequence(cache, TOKENS)
    other = [7, 8, 9, 10, 11]
    store_sequence(cache, other, seed=1)  # stored after: newer on disk than TOKENS' blocks
    blocks = cache.lookup(np.asarray(TOKENS)).blocks
    _, matched, tier = restored_state(cache, TOKENS)
    assert (matched, tier) == (11, "ram")
    cache.flush()
    times = {
        bytes.fromhex(key): when
        for key, when in cache.disk._store(False)._sql("SELECT key, access_time FROM Cache").fetchall()
    }
    first, second, last = (times[info.key] for info in blocks)
    newest_other = max(times[info.key] for info in cache.lookup(np.asarray(other)).blocks)
    assert first > second > last > newest_other
    cache.close()


def test_a_prefix_lost_by_both_tiers_is_stored_again_when_computed_again(tmp_path: Path) -> None:
    """The index still names blocks RAM evicted and the disk culled (it learns so only when a fetch misses):
    storing the same tokens again keeps them again, instead of skipping them as known."""
    cache = open_cache(tmp_path)
    blob = store_sequence(cache, TOKENS)
    blocks = cache.lookup(np.asarray(TOKENS)).blocks
    lost, kept = blocks[1], blocks[0]
    cache.ram.discard(lost)
    cache.disk.discard(lost)
    cache.ram.discard(kept)  # still on disk: not stored again
    assert cache.lookup(np.asarray(TOKENS)).tokens == 11  # the index does not know yet
    store_sequence(cache, TOKENS)
    assert lost.key in cache.ram
    assert cache.disk.holding([lost]) == {lost.key}
    assert kept.key not in cache.ram
    assert cache.disk.holding([kept]) == {kept.key}
    state, matched, _ = restored_state(cache, TOKENS)
    assert (state, matched) == (blob, 11)
    cache.close()


def test_a_lost_block_stored_again_with_other_bytes_is_never_served_under_its_old_record(tmp_path: Path) -> None:
    """A lookup took a block's record; before its fetch, the block is lost and stored again with other bytes
    (another computation, another process). The fetch must not serve the new bytes under the old record."""
    cache = open_cache(tmp_path)
    blob = store_sequence(cache, TOKENS)
    found = cache.lookup(np.asarray(TOKENS))
    lost = found.blocks[1]
    cache.ram.discard(lost)
    cache.disk.discard(lost)
    assert cache.has_new_blocks(TOKENS)  # indexed, but no tier keeps it: the engine stores it again
    store_sequence(cache, TOKENS, seed=1)  # other bytes for the same tokens
    assert cache.lookup(np.asarray(TOKENS)).blocks[1].checksum != lost.checksum
    fetched = cache.fetch(found, np.asarray(TOKENS))
    assert fetched is not None
    assert fetched.tokens == 4  # the block under its old record is a miss, never the new bytes
    assert fetched.state.tobytes() == assemble_state(LAYOUT, [(4, blob_piece(blob, 0, 4))], 0).tobytes()
    cache.close()


def entries_of(cache: PrefixCache, tokens: list[int]) -> list[object]:
    """What the cache holds along `tokens`: in its index, its RAM tier and its disk tier."""
    along = cache.index.entries_along(np.asarray(tokens))
    return [*along, *(info.key for info in along if info.key in cache.ram), *cache.disk.holding(along)]


def test_forgetting_removes_a_prompts_entries_from_ram_and_disk_and_leaves_what_is_kept(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    shared = [7, 7, 7, 7]  # one block both prompts begin with (a persona)
    deleted, kept = [*shared, *TOKENS], [*shared, 1, 2, 3, 4, 5]
    store_sequence(cache, deleted)
    store_sequence(cache, kept)
    own = [info for info in cache.index.entries_along(np.asarray(deleted)) if info.start >= len(shared)]
    assert [(info.start, info.end) for info in own] == [(4, 8), (8, 12), (12, 15)]
    assert cache.disk.holding(own) == {info.key for info in own}

    gone = cache.forget([deleted], keep=[kept])
    assert gone == len(own)
    assert entries_of(cache, deleted) == entries_of(cache, shared)  # the shared block alone is left
    assert len(entries_of(cache, shared)) == 3  # in the index, in RAM and on disk
    assert cache.lookup(np.asarray(kept)).tokens == len(kept)
    assert restored_state(cache, kept)[1] == len(kept)
    reopened = open_cache(tmp_path)  # nothing of it comes back from disk in another process
    assert reopened.lookup(np.asarray(deleted)).tokens == len(shared)


def test_forgetting_leaves_pinned_entries_and_is_a_no_op_for_what_was_never_stored(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    store_sequence(cache, TOKENS)
    assert cache.pin(TOKENS[:8]) == 2
    assert cache.forget([TOKENS]) == 1  # the partial block; the two pinned ones stay
    assert cache.lookup(np.asarray(TOKENS)).tokens == 8
    assert cache.forget([[5, 5, 5, 5, 5]]) == 0


def test_a_stored_state_is_let_go_once_its_blocks_are_written(tmp_path: Path) -> None:
    """The writer keeps no reference to the last state it stored: a gigabyte state would stay resident until the
    next store."""
    import gc
    import weakref

    cache = open_cache(tmp_path)
    blob, _ = make_state(KV_LAYOUT, list(range(len(TOKENS))), seq_id=0, stream=0, seed=0)
    state = np.frombuffer(bytearray(blob), dtype=np.uint8)
    held = weakref.ref(state.base) if state.base is not None else weakref.ref(state)
    cache.store(TOKENS, state)
    del state
    cache.flush()
    gc.collect()
    assert held() is None
    assert cache.lookup(np.asarray(TOKENS)).tokens == len(TOKENS)
