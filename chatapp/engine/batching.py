"""Where a prefill's batches end, and where it keeps checkpoints of the uncuttable state.

Both decide whether a warm prefill computes what a cold run computes: llama.cpp's kernels
round differently for different batch shapes, so a restored or continued prefix is exact
only when its batches fall where a cold run's do.

Most CPU kernels give a row the same bits however the prompt is split (split_rule.py probes
it), and then batches end at multiples of n_batch and at checkpoints. Where they do not (Gemma
3's tinyBLAS path, any GPU), a token's KV depends on which batch it was in, and the only
batches a cold run and every warm one agree on are fixed ones: every prompt is computed on a
grid of GRID_TOKENS-token batches from position 0, checkpoints sit on grid points, and only
whole grid batches are reused (in place or from the cache).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

MIN_BATCH = 3  # with n_batch 2, a prompt of three tokens could only be split with a lone token
MIN_ROWS = 2  # a one-token batch takes matrix-vector kernels: its KV differs from a longer batch's
# llama.cpp's CPU flash attention computes a batch of at least this many query rows with its tiled
# kernel (GGML_FA_TILE_Q), each row alike whatever the batch; fewer rows take another kernel that
# rounds differently (tools/batch_invariance.py --flash: 0.0 apart with every batch of 64 or more,
# up to 1.0 with one of 63 or fewer). With flash attention every batch has at least this many.
FLASH_ATTENTION_ROWS = 64
# The fixed batches of a model whose KV depends on where batches end: the cache's block size, so
# a stored block is one whole grid batch.
GRID_TOKENS = 64


def batch_end(
    start: int, length: int, batch: int, checkpoints: frozenset[int], min_rows: int = MIN_ROWS, *, grid: int = 0
) -> int:
    """Where the batch from `start` ends, of a prompt of `length` tokens.

    On a `grid` the batch ends at the next grid point (or the prompt's end), whatever else:
    the same batches for every run of the prompt, the last one however short.

    Batches end at multiples of n_batch, as in a cold run, and at checkpoint positions. No
    batch has fewer than `min_rows` tokens unless the whole rest is shorter: a one-token
    batch takes other kernels (matrix-vector) whose KV is not bit-identical to a longer
    batch's (and on a state that cannot be cut it could not be redone with the token before
    it), as does a flash-attention batch of fewer than FLASH_ATTENTION_ROWS. No batch leaves
    fewer behind, and no checkpoint makes one.
    """
    if grid:
        return min(length, (start // grid + 1) * grid)
    end = min(length, max((start // batch + 1) * batch, start + min_rows))
    if 0 < length - end < min_rows:
        # Take the rest now where it fits, else leave `min_rows` for the next batch.
        end = length if length - start <= batch else max(length - min_rows, start + min_rows)
    for position in sorted(checkpoints):
        if start + min_rows <= position < end and not 0 < length - position < min_rows:
            return position
    return end


def stored_checkpoint_positions(length: int, boundaries: Iterable[int], interval: int, *, last: int) -> set[int]:
    """The checkpoints of a prompt of `length` tokens worth keeping in the cache.

    The boundaries the request names (persona, document and history ends), the prompt's
    end (`last`: a warm-up's end, where the question typed after it begins, or an answered
    prompt's end less the tokens every answer evaluates again, where a regenerate or a
    client that sends the answer back in its own words resumes), and between them one every
    `interval` tokens, but none within half an interval of the next: a checkpoint holds a
    whole window or recurrent state, often as much as thousands of tokens of KV.
    """
    interval = max(interval, 2)
    positions = {position for position in (*boundaries, last) if 0 < position <= length}
    anchors = sorted({0, *positions, length})
    for start, end in itertools.pairwise(anchors):
        positions.update(range(start + interval, end - interval // 2 + 1, interval))
    return positions


def on_grid(position: int, grid: int) -> int:
    """`position` rounded down to a grid point (itself without a grid)."""
    return position - position % grid if grid else position
