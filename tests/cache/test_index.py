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
