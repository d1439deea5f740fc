"""The prefix cache with sliding-window, recurrent and hybrid models (synthetic states, no model).

Such a model restores a prefix only where a checkpoint (its window or recurrent state at
one position) was stored: exactly there, byte for byte, or not at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cache.keys import BlockKey
from cache.memory_kinds import MemoryKind, memory_of
from cache.namespace import Namespace
from cache.prefix_cache import CacheConfig, PrefixCache
from cache.state_format import checkpoint_payload, parse_state
from tests.cache.damage import flip_two_bytes, stored_in_file, truncate
from tests.cache.state_factory import SyntheticModel, SyntheticSequence, has_base, needs_checkpoints, synthetic_model

# Checkpoints a few tokens apart are the subject of most tests here: every one is stored.
CONFIG = CacheConfig(
    block_size=4, ram_budget_bytes=8 << 20, disk_budget_bytes=1 << 26, ttl_seconds=3600, checkpoint_min_gap=0
)
# Rows and recurrent states over 32 KiB: blocks and checkpoints are stored as files.
MODELS = {
    MemoryKind.PLAIN: synthetic_model(MemoryKind.PLAIN, scale=512),
    MemoryKind.ISWA: synthetic_model(MemoryKind.ISWA, window=3, scale=512),
    MemoryKind.RECURRENT: synthetic_model(MemoryKind.RECURRENT, recurrent_rows=40_000),
    MemoryKind.HYBRID: synthetic_model(MemoryKind.HYBRID, v_trans=True, scale=512, recurrent_rows=40_000),
    MemoryKind.HYBRID_ISWA: synthetic_model(MemoryKind.HYBRID_ISWA, window=3, scale=512, recurrent_rows=40_000),
}
CHECKPOINTED = [MemoryKind.ISWA, MemoryKind.RECURRENT, MemoryKind.HYBRID, MemoryKind.HYBRID_ISWA]
WITH_KV = [MemoryKind.ISWA, MemoryKind.HYBRID, MemoryKind.HYBRID_ISWA]
TOKENS = list(range(100, 111))  # 11 tokens: blocks of 4, 4 and a partial 3


def blocks_of(kind: MemoryKind, tokens: int) -> int:
    return -(-tokens // CONFIG.block_size) if has_base(kind) else 0


class Harness:
    """A cache for one synthetic model, and the sequence whose states it stores."""

    def __init__(
        self,
        folder: Path,
        kind: MemoryKind,
        model_name: str = "model-a",
        config: CacheConfig = CONFIG,
        model: SyntheticModel | None = None,
    ) -> None:
        self.config = config
        self.folder = folder
        self.kind = kind
        self.model = model or MODELS[kind]
        self.sequence = SyntheticSequence(self.model, 16, seed=3)
        self.model_name = model_name
        self.cache = self.open()

    def open(self) -> PrefixCache:
        layout = self.model.layout
        space = Namespace(
            self.model_name, 1, 1, True, self.config.block_size, "0.3.36", layout_digest=layout.digest().hex()
        )
        return PrefixCache(self.folder, space, layout, self.config)

    def restart(self) -> PrefixCache:
        self.cache.close()
        self.cache = self.open()
        return self.cache

    def store(self, tokens: list[int]) -> bytes:
        """Store the full state after `tokens` (the sequence's first len(tokens) positions)."""
        blob = self.sequence.state(len(tokens))
        self.cache.store(tokens, np.frombuffer(blob, dtype=np.uint8))
        self.cache.flush()
        return blob

    def checkpoint(self, n: int) -> bytes:
        """What the engine keeps at position n: the checkpoint of the partial state read there."""
        return checkpoint_payload(
            parse_state(self.sequence.partial(n), memory_of(self.kind), partial=True), self.model.window
        )

    def store_checkpoint(self, tokens: list[int]) -> None:
        self.cache.store_checkpoint(tokens, self.checkpoint(len(tokens)))
        self.cache.flush()

    def restore(self, prompt: list[int], limit: int | None = None, dest: int = 0) -> tuple[bytes, int, str] | None:
        """The state the cache restores for `prompt` into sequence `dest`, its tokens and tier; None on a miss."""
        array = np.asarray(prompt)
        found = self.cache.lookup(array, limit)
        fetched = self.cache.fetch(found, array, dest)
        if fetched is None:
            return None
        assert fetched.tokens == found.tokens
        assert fetched.prompt_tokens == tuple(prompt[: fetched.tokens])
        assert (fetched.checkpoint is not None) == needs_checkpoints(self.kind)
        self.cache.flush()
        return fetched.state.tobytes(), fetched.tokens, fetched.tier

    def close(self) -> None:
        self.cache.close()


@pytest.fixture(params=CHECKPOINTED, ids=[kind.value for kind in CHECKPOINTED])
def kind(request: pytest.FixtureRequest) -> MemoryKind:
    chosen: MemoryKind = request.param
    return chosen


@pytest.fixture
def harness(tmp_path: Path, kind: MemoryKind) -> Harness:
    return Harness(tmp_path, kind)


def test_a_stored_state_comes_back_byte_for_byte_with_its_checkpoint(harness: Harness) -> None:
    blob = harness.store(TOKENS)
    found = harness.cache.lookup(np.asarray([*TOKENS, 999, 998]))
    assert found.tokens == 11
    assert found.checkpoint is not None
    assert found.checkpoint.checkpoint
    assert found.checkpoint.end == 11
    assert len(found.blocks) == blocks_of(harness.kind, 11)
    assert harness.restore([*TOKENS, 999, 998]) == (blob, 11, "ram")
    restored = harness.restore([*TOKENS, 999], dest=1)
    assert restored is not None
    assert restored[0] == harness.sequence.state(11, seq_id=1)  # into another sequence's stream
    harness.close()


def test_a_recurrent_model_needs_no_blocks_at_all(tmp_path: Path) -> None:
    harness = Harness(tmp_path, MemoryKind.RECURRENT)
    blob = harness.store(TOKENS)
    assert not harness.cache.index.entries
    assert len(harness.cache.index) == 1
    found = harness.cache.lookup(np.asarray([*TOKENS, 1]))
    assert (found.tokens, found.blocks) == (11, ())
    fetched = harness.cache.fetch(found, np.asarray([*TOKENS, 1]))
    assert fetched is not None
    assert fetched.blocks == ()
    assert harness.restore([*TOKENS, 1]) == (blob, 11, "ram")
    assert not harness.cache.has_new_blocks(TOKENS)
    assert harness.cache.has_new_blocks(TOKENS[:10])  # no checkpoint there
    harness.close()


@pytest.mark.parametrize("kind", [MemoryKind.PLAIN, *CHECKPOINTED], ids=lambda kind: kind.value)
def test_a_prompt_that_diverges_early_gets_only_what_a_checkpoint_covers(tmp_path: Path, kind: MemoryKind) -> None:
    harness = Harness(tmp_path, kind)
    harness.store(TOKENS)
    diverging = [*TOKENS[:7], 999, 998, 997]
    if needs_checkpoints(kind):
        assert harness.cache.lookup(np.asarray(diverging)).tokens == 0
        assert harness.restore(diverging) is None  # no checkpoint at or before the divergence
    else:  # plain KV restores any prefix of its blocks
        assert harness.restore(diverging) == (harness.sequence.state(7), 7, "ram")
        harness.close()
        return
    harness.store_checkpoint(TOKENS[:4])  # at a block boundary
    assert harness.restore(diverging) == (harness.sequence.state(4), 4, "ram")
    harness.store_checkpoint(TOKENS[:6])  # inside a block: the block is trimmed
    assert harness.restore(diverging) == (harness.sequence.state(6), 6, "ram")
    harness.store_checkpoint(TOKENS[:8])  # past the divergence: never used for this prompt
    assert harness.restore(diverging) == (harness.sequence.state(6), 6, "ram")
    assert harness.restore(TOKENS[:9]) == (harness.sequence.state(8), 8, "ram")
    # The limit: the deepest checkpoint at or before it.
    assert harness.restore(TOKENS, limit=10) == (harness.sequence.state(8), 8, "ram")
    assert harness.restore(TOKENS, limit=5) == (harness.sequence.state(4), 4, "ram")
    assert harness.restore(TOKENS, limit=3) is None
    assert harness.restore(TOKENS) == (harness.sequence.state(11), 11, "ram")
    assert harness.cache.has_checkpoint(TOKENS[:6])
    assert not harness.cache.has_checkpoint(TOKENS[:5])
    harness.close()


def test_a_checkpoint_restores_from_the_longer_block_that_superseded_its_own(harness: Harness) -> None:
    harness.store(TOKENS[:6])  # a full block and a partial of 2, a checkpoint at 6
    harness.store(TOKENS)  # the partial is superseded by [4, 8)
    if has_base(harness.kind):
        sizes = sorted(info.tokens.size for info in harness.cache.index.entries.values())
        assert sizes == [3, 4, 4]
    assert len(harness.cache.index.checkpoints) == 2
    prompt = [*TOKENS[:6], 999]
    assert harness.restore(prompt) == (harness.sequence.state(6), 6, "ram")
    harness.close()


def test_checkpoints_survive_a_restart_and_count(harness: Harness) -> None:
    blob = harness.store(TOKENS)
    harness.store_checkpoint(TOKENS[:4])
    harness.store_checkpoint(TOKENS[:4])  # twice: stored once
    entries = blocks_of(harness.kind, 11) + 2
    assert len(harness.cache.index) == entries
    assert harness.cache.stats()["index_entries"] == entries
    assert harness.cache.stats()["disk"]["entries"] == entries
    cache = harness.restart()
    assert len(cache.index) == entries  # rebuilt from the records alone
    assert len(cache.index.checkpoints) == 2
    assert all(info.checkpoint for info in cache.index.checkpoints.values())
    assert not any(info.checkpoint for info in cache.index.entries.values())
    assert harness.restore([*TOKENS, 5]) == (blob, 11, "disk")
    assert harness.restore([*TOKENS, 5]) == (blob, 11, "ram")  # promoted
    assert harness.restore([*TOKENS[:5], 5]) == (harness.sequence.state(4), 4, "disk")  # its own checkpoint
    stats = cache.stats()
    assert stats["index_entries"] == entries
    assert stats["disk"]["entries"] == entries
    assert stats["ram"]["entries"] == entries  # every entry was fetched once, and promoted
    harness.close()


Damage = Callable[[Path, bytes], None]


@pytest.mark.parametrize("damage", [flip_two_bytes, truncate], ids=["flipped", "truncated"])
def test_a_damaged_checkpoint_is_dropped_and_never_restored(harness: Harness, damage: Damage) -> None:
    blob = harness.store(TOKENS)
    harness.store_checkpoint(TOKENS[:4])
    deepest = harness.cache.lookup(np.asarray(TOKENS)).checkpoint
    assert deepest is not None
    assert stored_in_file(harness.folder, deepest.key)  # a file, as large checkpoints are
    cache = harness.restart()
    damage(harness.folder, deepest.key)
    assert cache.fetch(cache.lookup(np.asarray(TOKENS)), np.asarray(TOKENS)) is None
    assert deepest.key not in cache.index  # dropped, so it is taken again next time
    assert len(cache.index) == blocks_of(harness.kind, 11) + 1
    assert harness.restore(TOKENS) == (harness.sequence.state(4), 4, "disk")  # the one before it
    harness.store(TOKENS)
    # The checkpoint taken again; its blocks were never read (the fetch stopped at the damaged checkpoint).
    assert harness.restore(TOKENS) == (blob, 11, "disk" if harness.kind in WITH_KV else "ram")
    harness.close()


@pytest.mark.parametrize("kind", WITH_KV, ids=lambda kind: kind.value)
def test_a_damaged_block_drops_the_prefix_behind_it(harness: Harness) -> None:
    harness.store(TOKENS)
    harness.store_checkpoint(TOKENS[:4])
    second = harness.cache.lookup(np.asarray(TOKENS)).blocks[1]
    cache = harness.restart()
    flip_two_bytes(harness.folder, second.key)
    assert cache.fetch(cache.lookup(np.asarray(TOKENS)), np.asarray(TOKENS)) is None  # all or nothing
    assert second.key not in cache.index
    assert harness.restore(TOKENS) == (harness.sequence.state(4), 4, "disk")
    harness.close()


def test_pinning_covers_the_checkpoint(harness: Harness) -> None:
    harness.store(TOKENS)
    entries = blocks_of(harness.kind, 11) + 1
    assert harness.cache.pin(TOKENS) == entries
    assert all(info.pinned for info in harness.cache.index.everything())
    stats = harness.cache.stats()
    assert stats["pinned_entries"] == entries
    assert stats["disk"]["pinned_entries"] == entries
    cache = harness.restart()
    assert all(info.pinned for info in cache.index.everything())
    assert harness.restore(TOKENS) == (harness.sequence.state(11), 11, "disk")
    assert cache.pin(TOKENS, pinned=False) == entries
    assert not any(info.pinned for info in cache.index.everything())
    assert cache.clear() == entries
    assert len(cache.index) == 0
    assert harness.restore(TOKENS) is None
    harness.close()


def test_states_and_checkpoints_that_do_not_fit_are_not_stored(harness: Harness) -> None:
    cache = harness.cache
    sequence = harness.sequence
    cache.store(TOKENS[:10], np.frombuffer(sequence.state(11), dtype=np.uint8))  # one token too many
    cache.store(TOKENS, np.frombuffer(sequence.state(11)[:-1], dtype=np.uint8))  # truncated
    if has_base(harness.kind):  # a partial state is not a full one
        cache.store(TOKENS, np.frombuffer(sequence.partial(11), dtype=np.uint8))
    other = next(kind for kind in CHECKPOINTED if kind is not harness.kind)
    other_state = SyntheticSequence(MODELS[other], 11).state(11)
    cache.store(TOKENS, np.frombuffer(other_state, dtype=np.uint8))  # another model's layout
    cache.store_checkpoint(TOKENS[:5], harness.checkpoint(6))  # taken at another position
    cache.store_checkpoint(TOKENS[:6], harness.checkpoint(6)[:-1])  # damaged
    cache.flush()
    assert len(cache.index) == 0
    assert harness.restore(TOKENS) is None
    harness.close()


def test_layouts_never_share_entries(tmp_path: Path) -> None:
    first = Harness(tmp_path, MemoryKind.HYBRID_ISWA)
    first.store(TOKENS)
    first.close()
    for kind in (MemoryKind.ISWA, MemoryKind.HYBRID, MemoryKind.PLAIN):
        other = Harness(tmp_path, kind)
        assert len(other.cache.index) == 0
        assert other.restore(TOKENS) is None
        other.close()
    again = Harness(tmp_path, MemoryKind.HYBRID_ISWA)
    assert len(again.cache.index) == blocks_of(MemoryKind.HYBRID_ISWA, 11) + 1
    again.close()


def test_a_block_boundary_checkpoint_has_an_empty_tail(harness: Harness) -> None:
    harness.store(TOKENS[:8])
    checkpoint = harness.cache.lookup(np.asarray(TOKENS)).checkpoint
    assert checkpoint is not None
    assert (checkpoint.start, checkpoint.tokens.size) == (8, 0)
    assert harness.restore(TOKENS) == (harness.sequence.state(8), 8, "ram")
    cache = harness.restart()
    assert harness.restore(TOKENS) == (harness.sequence.state(8), 8, "disk")
    assert BlockKey(checkpoint.key) in cache.index
    harness.close()


def test_a_checkpoint_a_few_tokens_after_a_stored_one_is_not_stored(tmp_path: Path, kind: MemoryKind) -> None:
    """An answer's end, then the next turn's history end two template tokens on: the first serves both."""
    harness = Harness(tmp_path, kind, config=replace(CONFIG, checkpoint_min_gap=3))
    harness.store(TOKENS[:4])  # blocks and a checkpoint at 4
    harness.store_checkpoint(TOKENS[:6])  # 2 tokens on: not stored
    assert not harness.cache.has_checkpoint(TOKENS[:6])
    assert harness.restore([*TOKENS[:6], 5]) == (harness.sequence.state(4), 4, "ram")  # 2 tokens to compute
    harness.store_checkpoint(TOKENS[:7])  # 3 tokens on: stored
    assert harness.cache.has_checkpoint(TOKENS[:7])
    harness.store_checkpoint([*TOKENS[:5], 999])  # another branch, 2 tokens past 4: not stored either
    assert not harness.cache.has_checkpoint([*TOKENS[:5], 999])
    harness.store_checkpoint([*TOKENS[:2], 999, 998, 997])  # no checkpoint before it on this branch: stored
    assert harness.cache.has_checkpoint([*TOKENS[:2], 999, 998, 997])
    assert sorted(info.end for info in harness.restart().index.checkpoints.values()) == [4, 5, 7]
    harness.close()


@pytest.mark.parametrize("kind", [MemoryKind.ISWA, MemoryKind.HYBRID_ISWA], ids=lambda kind: kind.value)
def test_a_checkpoint_close_after_another_stores_only_the_window_cells_it_adds(
    tmp_path: Path, kind: MemoryKind
) -> None:
    """A question's end, then the answer's: their windows share all but a few cells, stored once."""
    model = synthetic_model(kind, window=8, scale=512, recurrent_rows=40_000)
    harness = Harness(tmp_path, kind, model=model)
    cache = harness.cache
    harness.store(TOKENS[:6])  # blocks and a whole checkpoint at 6
    (whole,) = cache.index.checkpoints.values()
    assert whole.extends is None
    harness.store_checkpoint(TOKENS[:9])  # 3 tokens on, within half a window: a delta
    delta = next(info for info in cache.index.checkpoints.values() if info.end == 9)
    assert delta.extends == whole.key
    assert delta.payload_size < len(harness.checkpoint(9))
    harness.store(TOKENS[:10])  # 1 token after a delta, 4 after the whole one: a delta on the whole one
    assert next(info for info in cache.index.checkpoints.values() if info.end == 10).extends == whole.key
    harness.store(TOKENS)  # 5 tokens after the whole one: more than half a window, whole again
    assert next(info for info in cache.index.checkpoints.values() if info.end == 11).extends is None
    assert harness.restore([*TOKENS[:9], 5]) == (harness.sequence.state(9), 9, "ram")
    assert harness.restore([*TOKENS[:10], 5]) == (harness.sequence.state(10), 10, "ram")
    cache = harness.restart()
    assert harness.restore([*TOKENS[:9], 5]) == (harness.sequence.state(9), 9, "disk")
    assert cache.pin(TOKENS[:9]) == blocks_of(kind, 9) + 2  # the delta and the checkpoint it extends
    assert cache.index.checkpoints[whole.key].pinned
    cache.pin(TOKENS[:9], pinned=False)
    # Without the checkpoint it extends, a delta is never restored (nor kept).
    cache.entries.forget(cache.index.checkpoints[whole.key])
    assert cache.lookup(np.asarray([*TOKENS[:9], 5])).tokens == 0
    assert harness.restore([*TOKENS[:9], 5]) is None
    assert not cache.has_checkpoint(TOKENS[:9])
    assert harness.restore(TOKENS) == (harness.sequence.state(11), 11, "disk")
    harness.close()


@pytest.mark.parametrize("kind", [MemoryKind.ISWA, MemoryKind.HYBRID_ISWA], ids=lambda kind: kind.value)
def test_deltas_whose_base_changed_fall_back_and_pins_stay_while_needed(tmp_path: Path, kind: MemoryKind) -> None:
    model = synthetic_model(kind, window=8, scale=512, recurrent_rows=40_000)
    harness = Harness(tmp_path, kind, model=model)
    cache = harness.cache
    branch = [*TOKENS[:6], 900, 901, 902]
    harness.store(TOKENS[:6])  # whole at 6
    harness.store(TOKENS[:9])  # blocks, and a delta on it
    harness.store(branch)  # another conversation's blocks and delta on it
    whole = next(info for info in cache.index.checkpoints.values() if info.end == 6)
    assert sum(info.extends == whole.key for info in cache.index.checkpoints.values()) == 2
    assert cache.pin(TOKENS[:9]) > 0
    assert cache.pin(branch) > 0
    cache.pin(TOKENS[:9], pinned=False)
    assert cache.index.checkpoints[whole.key].pinned  # the branch's pinned delta still needs it
    cache.pin(branch, pinned=False)
    assert not cache.index.checkpoints[whole.key].pinned
    # The whole checkpoint at 6 is lost, then stored again as a delta on one at 4.
    cache.entries.forget(cache.index.checkpoints[whole.key])
    harness.store_checkpoint(TOKENS[:4])
    harness.store_checkpoint(TOKENS[:6])
    again = next(info for info in cache.index.checkpoints.values() if info.end == 6)
    assert again.key == whole.key
    assert again.extends is not None
    # The delta at 9 was built on the whole one: never joined to the new delta; the one at 6 serves.
    assert harness.restore([*TOKENS[:9], 5]) == (harness.sequence.state(6), 6, "ram")
    assert not cache.has_checkpoint(TOKENS[:9])
    harness.close()


@pytest.mark.parametrize("kind", [MemoryKind.ISWA, MemoryKind.HYBRID_ISWA], ids=lambda kind: kind.value)
def test_a_delta_is_never_joined_to_a_base_another_process_stored_again(tmp_path: Path, kind: MemoryKind) -> None:
    model = synthetic_model(kind, window=8, scale=512, recurrent_rows=40_000)
    first = Harness(tmp_path, kind, model=model)
    first.store(TOKENS[:6])  # whole at 6
    first.store(TOKENS[:9])  # a delta on it at 9
    assert any(info.extends is not None for info in first.cache.index.checkpoints.values())
    # Another process on the same folder computed the same tokens with other bytes, and stored
    # its own whole checkpoint at 6 in place of the first one's.
    second = Harness(tmp_path, kind, model=model)
    second.sequence = SyntheticSequence(model, 16, seed=4)
    base = next(info for info in second.cache.index.checkpoints.values() if info.end == 6)
    second.cache.entries.forget(base)
    second.store_checkpoint(TOKENS[:6])
    # The first process still holds its delta and, in RAM, its own base: it restores the other
    # process's whole checkpoint (read from disk) alone, never its delta joined to either base.
    restored = first.restore([*TOKENS[:9], 5])
    assert restored is not None
    state, tokens, tier = restored
    assert (tokens, tier) == (6, "disk")
    assert state != first.sequence.state(6)  # the window cells are the other process's
    second.close()
    first.close()


def test_a_checkpoint_lost_by_both_tiers_is_stored_again(harness: Harness) -> None:
    """The index still names a checkpoint RAM evicted and the disk culled: asked, the cache says it has none,
    and the engine's next checkpoint there is kept again (as lost blocks are)."""
    harness.store(TOKENS)
    harness.store_checkpoint(TOKENS[:4])
    cache = harness.cache
    lost = cache.index.checkpoints.get(cache.index.checkpoint_key(np.asarray(TOKENS[:4]))[0])
    assert lost is not None
    assert cache.has_checkpoint(TOKENS[:4])
    cache.ram.discard(lost)
    cache.disk.discard(lost)
    assert not cache.has_checkpoint(TOKENS[:4])
    harness.store_checkpoint(TOKENS[:4])
    assert lost.key in cache.ram
    assert cache.disk.holding([lost]) == {lost.key}
    assert harness.restore([*TOKENS[:5], 5]) == (harness.sequence.state(4), 4, "ram")
    harness.close()
