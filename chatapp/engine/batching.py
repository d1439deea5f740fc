"""Where a prefill's batches end, and where it keeps checkpoints of the uncuttable state.

Both decide whether a warm prefill computes what a cold run computes: llama.cpp's kernels
round differently for different batch shapes, so a restored or continued prefix is exact
only when its batches fall where a cold run's do.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

MIN_BATCH = 3  # with n_batch 2, a prompt of three tokens could only be split with a lone token


def batch_end(start: int, length: int, batch: int, checkpoints: frozenset[int]) -> int:
    """Where the batch from `start` ends, of a prompt of `length` tokens.

    Batches end at multiples of n_batch, as in a cold run, and at checkpoint positions. A
    one-token batch takes other kernels (matrix-vector) whose KV is not bit-identical to a
    longer batch's, and on a state that cannot be cut it could not be redone with the token
    before it: no batch leaves a single token behind, and no checkpoint makes one.
    """
    end = min(length, max((start // batch + 1) * batch, start + 2))
    if length - end == 1:
        # Take the last token now where it fits, else leave two for the next batch.
        end = length if length - start <= batch else max(end - 1, start + 2)
    for position in sorted(checkpoints):
        if start + 2 <= position < end and length - position != 1:
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
