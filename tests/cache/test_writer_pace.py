"""The writer's backlog: the states waiting for it hold at most a byte limit; past it, a newer one takes the
oldest waiting one's place."""

from __future__ import annotations

import threading
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from cache.memory_kinds import PlainMemory
from cache.namespace import Namespace
from cache.prefix_cache import CacheConfig, PrefixCache
from cache.state_format import MemoryLayout
from cache.writer_pace import MIN_HELD_BYTES, StoreBacklog
from tests.cache.state_factory import make_state, small_layout

KV_LAYOUT = small_layout(v_trans=False)
LAYOUT = MemoryLayout(PlainMemory(), KV_LAYOUT, None, 0)
CONFIG = CacheConfig(block_size=4, ram_budget_bytes=1 << 20, disk_budget_bytes=1 << 24, ttl_seconds=3600)


STATE = MIN_HELD_BYTES // 2  # two fit in the limit


def test_past_the_limit_the_oldest_store_not_begun_is_given_up() -> None:
    backlog = StoreBacklog(0)  # the least: MIN_HELD_BYTES
    ran: list[str] = []
    first, second, third = (backlog.queued(partial(ran.append, name), STATE) for name in "abc")
    assert (backlog.held_bytes, backlog.given_up) == (2 * STATE, 1)
    first()  # the writer reaches it: given up, nothing runs
    second()
    third()
    assert ran == ["b", "c"]
    assert backlog.held_bytes == 0
    small = [backlog.queued(partial(ran.append, "small"), 1_000) for _ in range(100)]
    assert backlog.given_up == 1  # small states: all of them kept
    for store in small:
        store()
    assert ran.count("small") == 100


def test_the_store_being_written_is_never_given_up() -> None:
    backlog = StoreBacklog(0)
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def slow() -> None:
        started.set()
        release.wait(10)
        ran.append("a")

    writing = threading.Thread(target=backlog.queued(slow, STATE))
    writing.start()
    assert started.wait(10)
    later = [backlog.queued(partial(ran.append, name), STATE) for name in "bc"]
    assert backlog.given_up == 1  # b: c takes its place beside the one being written
    release.set()
    writing.join()
    for store in later:
        store()
    assert ran == ["a", "c"]


def test_a_cache_whose_writer_is_behind_stores_the_newest_states(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three sequences stored while the writer is held, two states' worth allowed: the oldest is not stored,
    the two newest are."""
    space = Namespace("model-a", 1, 1, True, CONFIG.block_size, "0.3.36", layout_digest=LAYOUT.digest().hex())
    cache = PrefixCache(tmp_path, space, LAYOUT, CONFIG)
    state_bytes = len(make_state(KV_LAYOUT, list(range(8)), seq_id=0, stream=0)[0])
    monkeypatch.setattr(cache.writer._backlog, "limit_bytes", 2 * state_bytes)
    held = threading.Event()
    cache.writer._queue.put(partial(held.wait, 10))  # type: ignore[arg-type]  # the writer, held
    sequences = [[1000 * number + index for index in range(8)] for number in (1, 2, 3)]
    for seed, tokens in enumerate(sequences):
        blob, _ = make_state(KV_LAYOUT, list(range(len(tokens))), seq_id=0, stream=0, seed=seed)
        cache.store(tokens, np.frombuffer(blob, dtype=np.uint8))
    held.set()
    cache.flush()
    assert [cache.lookup(np.asarray(tokens)).tokens for tokens in sequences] == [0, 8, 8]
    cache.close()


def test_while_the_model_computes_the_writer_rests_after_each_block_and_not_when_it_is_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each stored block's work is followed by a rest (three times as long: BUSY_SHARE), only while
    the engine says it computes; every block is stored either way."""
    space = Namespace("model-a", 1, 1, True, CONFIG.block_size, "0.3.36", layout_digest=LAYOUT.digest().hex())
    cache = PrefixCache(tmp_path, space, LAYOUT, CONFIG)
    rests: list[float] = []
    monkeypatch.setattr("cache.writer_pace.time.sleep", rests.append)
    computing = [True]
    cache.pace.others_computing = lambda: computing[0]
    for number, busy in ((1, True), (2, False)):
        computing[0] = busy
        tokens = [1000 * number + index for index in range(12)]  # three blocks of 4
        blob, _ = make_state(KV_LAYOUT, list(range(len(tokens))), seq_id=0, stream=0, seed=number)
        cache.store(tokens, np.frombuffer(blob, dtype=np.uint8))
        cache.flush()
        assert cache.lookup(np.asarray(tokens)).tokens == 12
        assert len(rests) == 3  # the three blocks of the first store only
    assert all(rest > 0 for rest in rests)
    assert cache.pace.rested_s == pytest.approx(sum(rests))
    cache.close()
