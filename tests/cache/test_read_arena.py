"""The buffer disk restores read into: reused once given back, never while taken."""

from __future__ import annotations

import numpy as np

from cache.read_arena import ReadArenas


def test_a_buffer_is_reused_once_given_back_and_never_while_taken() -> None:
    arenas = ReadArenas(max_bytes=1_000)
    first = arenas.take(100)
    assert first.size >= 100
    while_taken = arenas.take(100)
    assert not np.shares_memory(first, while_taken)
    arenas.give(first)
    again = arenas.take(80)
    assert np.shares_memory(again, first)
    assert not np.shares_memory(arenas.take(80), first)  # taken again: other memory


def test_a_larger_need_grows_the_buffer_and_the_larger_one_is_kept() -> None:
    arenas = ReadArenas(max_bytes=1_000)
    small = arenas.take(100)
    arenas.give(small)
    grown = arenas.take(200)
    assert grown.size >= 200
    arenas.give(grown)
    arenas.give(small)  # a smaller one given back later does not replace it
    assert np.shares_memory(arenas.take(150), grown)


def test_a_buffer_over_the_limit_is_new_memory_each_time() -> None:
    arenas = ReadArenas(max_bytes=1_000)
    huge = arenas.take(5_000)
    assert huge.size == 5_000
    arenas.give(huge)
    assert not np.shares_memory(arenas.take(5_000), huge)
    capped = arenas.take(900)
    arenas.give(capped)
    assert arenas.take(1_000).size <= 1_000  # grown at most to the limit
