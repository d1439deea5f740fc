"""The buffer disk restores read into: reused once given back, never while taken (growth: StateBuffer's)."""

from __future__ import annotations

import numpy as np

from cache.read_arena import ReadArenas


def test_a_buffer_is_reused_once_given_back_and_never_while_taken() -> None:
    arenas = ReadArenas(max_bytes=1_000)
    first = arenas.take()
    memory = first.take(100)
    while_taken = arenas.take()
    assert while_taken is not first
    assert not np.shares_memory(while_taken.take(100), memory)
    arenas.give(first)
    again = arenas.take()
    assert again is first
    assert np.shares_memory(again.take(80), memory)
    assert arenas.take() is not first  # taken again: another buffer


def test_the_larger_of_two_buffers_given_back_is_kept() -> None:
    arenas = ReadArenas(max_bytes=1_000)
    small, large = arenas.take(), arenas.take()
    small.take(100)
    large.take(600)
    arenas.give(large)
    arenas.give(small)  # a smaller one given back later does not replace it
    assert arenas.take() is large
    assert arenas.take().capacity == 0  # a new one
