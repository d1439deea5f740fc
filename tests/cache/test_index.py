"""The radix index: hash probes per block, token-exact matches inside a block."""

from __future__ import annotations

import numpy as np

from cache.blocks import BlockInfo
from cache.index import BlockIndex
from cache.keys import ROOT_KEY, as_token_array, block_key

BLOCK = 4
SEED = 7


def store(index: BlockIndex, tokens: list[int]) -> None:
    """Add every block of `tokens`, the last one possibly partial."""
    array = as_token_array(tokens)
    for key, parent, start, end in index.keys_for(array):
        index.add(BlockInfo(key, parent, start, array[start:end].copy(), 0, 0))


def test_keys_chain_through_parents_and_depend_on_the_seed() -> None:
    tokens = as_token_array([1, 2, 3, 4])
    first = block_key(ROOT_KEY, tokens, SEED)
    assert block_key(first, tokens, SEED) != first
    assert block_key(ROOT_KEY, tokens, SEED + 1) != first
    assert block_key(ROOT_KEY, tokens[:3], SEED) != first  # a partial block is another key


def test_full_blocks_then_the_longest_partial_match() -> None:
    index = BlockIndex(BLOCK, SEED)
    store(index, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # blocks [1-4] [5-8] partial [9,10]
    match = index.longest_prefix(as_token_array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]))
    assert match.matched_tokens == 10
    assert len(match.blocks) == 3
    diverging = index.longest_prefix(as_token_array([1, 2, 3, 4, 5, 6, 99, 8]))
    assert diverging.matched_tokens == 6
    assert diverging.stored_tokens == 8
    ends_inside = index.longest_prefix(as_token_array([1, 2, 3, 4, 5]))
    assert ends_inside.matched_tokens == 5
    assert index.longest_prefix(as_token_array([2, 2])).matched_tokens == 0


def test_the_closest_sibling_wins_among_many() -> None:
    index = BlockIndex(BLOCK, SEED)
    for first in range(50):
        store(index, [first, 1, 2, 3])
        store(index, [first, 1, 5])
    match = index.longest_prefix(as_token_array([17, 1, 5, 8]))
    assert match.matched_tokens == 3
    assert match.blocks[0].tokens.tolist() == [17, 1, 5]


def test_removal_keeps_the_index_consistent() -> None:
    index = BlockIndex(BLOCK, SEED)
    store(index, [1, 2, 3, 4, 5])
    last = index.longest_prefix(as_token_array([1, 2, 3, 4, 5])).blocks[-1]
    index.remove(last.key)
    assert index.longest_prefix(as_token_array([1, 2, 3, 4, 5])).matched_tokens == 4
    assert last.key not in index
    assert len(index) == 1


def test_lookup_among_ten_thousand_conversations_finds_the_longest_match() -> None:
    """Many siblings under one parent: the sorted children give the exact longest match (bench/ times it)."""
    index = BlockIndex(64, SEED)
    rng = np.random.default_rng(0)
    persona = rng.integers(0, 49152, 2000).tolist()
    suffixes = rng.integers(0, 49152, (10_000, 200))
    for suffix in suffixes:
        store(index, persona + suffix.tolist())
    question = rng.integers(0, 49152, 200)
    match = index.longest_prefix(as_token_array(persona + question.tolist()))
    # Brute force over every conversation: how far past the persona can a stored one match?
    agreeing = np.cumprod(suffixes == question, axis=1).sum(axis=1).max()
    assert match.matched_tokens == 2000 + agreeing
    assert match.blocks[-1].tokens[:16].tolist() == persona[1984:2000]


# Checkpoints: anchored at the last block boundary at or before their position.


def add_checkpoint(index: BlockIndex, tokens: list[int]) -> BlockInfo:
    """Add a checkpoint after `tokens`, as the prefix cache does."""
    array = as_token_array(tokens)
    key, anchor, anchor_position = index.checkpoint_key(array)
    info = BlockInfo(key, anchor, anchor_position, array[anchor_position:].copy(), 0, 0, checkpoint=True)
    index.add(info)
    return info


def test_checkpoint_keys_are_deterministic_and_never_block_keys() -> None:
    index = BlockIndex(BLOCK, SEED)
    tokens = as_token_array([1, 2, 3, 4, 5, 6])
    key, anchor, anchor_position = index.checkpoint_key(tokens)
    assert index.checkpoint_key(tokens.copy()) == (key, anchor, anchor_position)
    assert BlockIndex(BLOCK, SEED).checkpoint_key(tokens) == (key, anchor, anchor_position)
    assert BlockIndex(BLOCK, SEED + 1).checkpoint_key(tokens)[0] != key  # the namespace seed counts
    blocks = index.keys_for(tokens)
    assert anchor_position == 4
    assert anchor == blocks[0][0]  # the key of the prefix up to the anchor
    assert key not in {block[0] for block in blocks}
    # At a block boundary the tail is empty, and the key is still not the block's.
    boundary = index.checkpoint_key(tokens[:4])
    assert boundary[1:] == (blocks[0][0], 4)
    assert boundary[0] != blocks[0][0]
    assert index.checkpoint_key(tokens[:0])[1:] == (ROOT_KEY, 0)
    assert index.checkpoint_key(tokens[:3])[1:] == (ROOT_KEY, 0)
    assert len({index.checkpoint_key(tokens[:n])[0] for n in range(7)}) == 7


def test_checkpoint_keys_depend_on_the_anchor_and_the_tail() -> None:
    index = BlockIndex(BLOCK, SEED)
    key, anchor, _ = index.checkpoint_key(as_token_array([1, 2, 3, 4, 5, 6]))
    other_anchor = index.checkpoint_key(as_token_array([1, 2, 9, 4, 5, 6]))
    assert other_anchor[0] != key
    assert other_anchor[1] != anchor
    other_tail = index.checkpoint_key(as_token_array([1, 2, 3, 4, 5, 9]))
    assert other_tail[0] != key
    assert other_tail[1] == anchor
    assert index.checkpoint_key(as_token_array([1, 2, 3, 4, 5]))[0] != key  # a shorter tail


def test_the_deepest_checkpoint_of_the_prompt_within_the_limit() -> None:
    index = BlockIndex(BLOCK, SEED)
    prompt = list(range(100, 114))
    for end in (2, 4, 6, 9, 13):
        add_checkpoint(index, prompt[:end])
    add_checkpoint(index, [*prompt[:10], 999])  # its tail leaves the prompt at 10
    add_checkpoint(index, [*prompt[:3], 999, *prompt[4:12]])  # leaves it in the first block
    assert len(index) == 7
    assert len(index.checkpoints) == 7
    assert not index.entries
    array = as_token_array(prompt)

    def deepest(limit: int, tokens: np.ndarray = array) -> int | None:
        found = index.deepest_checkpoint(tokens, limit)
        return None if found is None else found.end

    assert [deepest(limit) for limit in range(15)] == [
        None, None, 2, 2, 4, 4, 6, 6, 6, 9, 9, 9, 9, 13, 13,
    ]  # fmt: skip
    assert deepest(100) == 13  # the limit is capped at the prompt
    assert deepest(100, array[:12]) == 9
    found = index.deepest_checkpoint(array, 7)
    assert found is not None
    assert (found.start, found.tokens.tolist()) == (4, prompt[4:6])
    # A prompt that leaves the stored ones at 10 (inside the third block) keeps the checkpoints before.
    diverging = as_token_array([*prompt[:10], 999, 998, 997, 996])
    assert deepest(14, diverging) == 11  # the checkpoint after [..., 999]
    diverging = as_token_array([*prompt[:5], 555, *prompt[6:]])
    assert deepest(14, diverging) == 4  # the tail of 6 differs, and nothing after the fork is anchored
    assert deepest(14, as_token_array([*prompt[:1], 555, *prompt[2:]])) is None


def test_checkpoints_and_blocks_live_side_by_side() -> None:
    index = BlockIndex(BLOCK, SEED)
    tokens = [1, 2, 3, 4, 5, 6]
    store(index, tokens)
    checkpoint = add_checkpoint(index, tokens)
    at_boundary = add_checkpoint(index, tokens[:4])
    add_checkpoint(index, tokens)  # twice: kept once
    assert len(index) == 4
    assert checkpoint.key in index
    assert {info.key for info in index.everything()} == set(index.entries) | {checkpoint.key, at_boundary.key}
    match = index.longest_prefix(as_token_array([*tokens, 7]))
    assert match.matched_tokens == 6  # checkpoints are never blocks of a match
    assert all(not block.checkpoint for block in match.blocks)
    assert index.remove(checkpoint.key) is checkpoint
    assert checkpoint.key not in index
    assert index.deepest_checkpoint(as_token_array(tokens), 6) is at_boundary
    assert index.remove(at_boundary.key) is at_boundary
    assert index.deepest_checkpoint(as_token_array(tokens), 6) is None
    assert index.remove(at_boundary.key) is None
    assert len(index) == 2
    assert index.longest_prefix(as_token_array(tokens)).matched_tokens == 6


def test_entries_along_a_prompt_are_its_blocks_shorter_ones_and_checkpoints_past_a_missing_block() -> None:
    index = BlockIndex(BLOCK, SEED)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    store(index, prompt[:6])  # an earlier prompt: [1-4] and the short [5,6]
    store(index, prompt)  # [1-4] [5-8] [9,10]
    store(index, [1, 2, 3, 4, 5, 6, 99])  # another branch: [5,6,99] is not along the prompt
    middle = add_checkpoint(index, prompt[:7])
    elsewhere = add_checkpoint(index, [1, 2, 3, 4, 5, 99])
    index.remove(index.keys_for(as_token_array(prompt))[1][0])  # block [5-8] evicted: the walk goes past it
    along = index.entries_along(as_token_array(prompt))
    spans = sorted((info.start, info.end, info.checkpoint) for info in along)
    assert spans == [(0, 4, False), (4, 6, False), (4, 7, True), (8, 10, False)]
    assert middle in along
    assert elsewhere not in along
