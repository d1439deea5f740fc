"""Where prefill batches end and which checkpoints are stored: every case of small prompts."""

from __future__ import annotations

import itertools

import pytest

from chatapp.engine.batching import FLASH_ATTENTION_ROWS, batch_end, on_grid, stored_checkpoint_positions


def batches(
    length: int, batch: int, checkpoints: frozenset[int] = frozenset(), start: int = 0, min_rows: int = 2
) -> list[int]:
    """The sizes of the batches a prefill from `start` makes."""
    sizes = []
    while start < length:
        end = batch_end(start, length, batch, checkpoints, min_rows)
        assert start < end <= length
        sizes.append(end - start)
        start = end
    return sizes


@pytest.mark.parametrize("batch", [3, 4, 8, 32])  # (with n_batch 2, three tokens need a lone one)
def test_no_batch_leaves_one_token_alone_nor_exceeds_n_batch(batch: int) -> None:
    for length, start in itertools.product(range(1, 40), range(40)):
        if start >= length:
            continue
        sizes = batches(length, batch, start=start)
        assert all(size <= batch for size in sizes), (length, start, sizes)
        # A single token only where a single token was all that was left.
        assert all(size > 1 for size in sizes) or sizes == [1], (length, start, sizes)


@pytest.mark.parametrize("batch", [128, 200, 512])
def test_with_flash_attention_every_batch_has_the_tiled_kernels_rows(batch: int) -> None:
    rows = FLASH_ATTENTION_ROWS
    for length, start in itertools.product(range(1, 1200, 7), range(0, 1200, 13)):
        if start >= length:
            continue
        sizes = batches(length, batch, frozenset({300, 301, length - 5}), start=start, min_rows=rows)
        assert all(size <= batch for size in sizes), (length, start, sizes)
        # Fewer rows only where fewer were all that was left (the engine then starts earlier).
        assert all(size >= rows for size in sizes) or sizes == [length - start], (length, start, sizes)


def test_batches_end_where_a_cold_run_ends_them_and_at_checkpoints() -> None:
    assert batches(20, 8) == [8, 8, 4]
    assert batches(17, 8) == [8, 7, 2]  # not 8, 8, 1
    assert batches(9, 8) == [7, 2]
    assert batches(20, 8, frozenset({5})) == [5, 3, 8, 4]
    assert batches(20, 8, frozenset({19})) == [8, 8, 4]  # a checkpoint that would leave one token is skipped
    assert batches(20, 8, frozenset({1})) == [8, 8, 4]  # one that would make a one-token batch too


def test_interval_checkpoints_fall_between_boundaries_and_not_just_before_one() -> None:
    positions = stored_checkpoint_positions(2230, [2010], 1024, last=2228)
    assert positions == {1024, 2010, 2228}  # not 2048: the prompt ends 182 tokens later
    document = stored_checkpoint_positions(7000, [40, 5040], 1024, last=7000)
    assert document == {40, 1064, 2088, 3112, 4136, 5040, 6064, 7000}
    assert stored_checkpoint_positions(600, [], 1024, last=598) == {598}
    assert stored_checkpoint_positions(600, [700, 0], 1024, last=0) == set()  # out of range: dropped


def test_on_a_grid_every_run_of_a_prompt_makes_the_same_batches_from_any_grid_point() -> None:
    grid = 8
    for length in range(1, 60):
        cold = []
        start = 0
        while start < length:
            end = batch_end(start, length, 512, frozenset({5, 13}), 2, grid=grid)
            cold.append((start, end))
            start = end
        assert all(end - start == grid for start, end in cold[:-1]), cold  # checkpoints move no batch
        for resume in range(0, length, grid):  # a warm run from a whole grid batch makes the cold run's rest
            warm = []
            start = resume
            while start < length:
                end = batch_end(start, length, 512, frozenset(), 2, grid=grid)
                warm.append((start, end))
                start = end
            assert warm == [batch for batch in cold if batch[0] >= resume]


def test_grid_points_round_down() -> None:
    assert [on_grid(position, 64) for position in (0, 63, 64, 130)] == [0, 0, 64, 128]
    assert on_grid(130, 0) == 130
