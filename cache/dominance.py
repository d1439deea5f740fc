"""Offline 2-D dominance sums with numpy: for many queries (x, y), the weight of the points with
px <= x and py < y. Sizing advice (cache/sizing.py) needs one per run of a request's blocks.

A Fenwick tree does it point by point in Python, far too slowly for a long log. Here the points,
sorted by x, are cut into aligned blocks at each power of two; a query's prefix of points is at
most one block per level, and within a block the points are sorted by y, so one `searchsorted`
per level answers every query at once: O((P + Q) log P) work in a few dozen numpy calls.
"""

from __future__ import annotations

import numpy as np


def dominance_sums(px: np.ndarray, py: np.ndarray, weights: np.ndarray, qx: np.ndarray, qy: np.ndarray) -> np.ndarray:
    """For each query i: the sum of `weights` over points with px <= qx[i] and py < qy[i] (int64)."""
    answers = np.zeros(qx.size, dtype=np.int64)
    if px.size == 0 or qx.size == 0:
        return answers
    by_x = np.argsort(px, kind="stable")
    xs, ys, ws = px[by_x], py[by_x].astype(np.int64), weights[by_x].astype(np.int64)
    counts = np.searchsorted(xs, qx, side="right")  # the queries' prefixes of points [0, count)
    span = int(ys.max()) - int(ys.min()) + 2
    y_floor = int(ys.min())
    shifted_y = ys - y_floor
    query_y = np.clip(qy.astype(np.int64) - y_floor, 0, span - 1)
    covered = np.zeros(qx.size, dtype=np.int64)  # points of each prefix already summed
    for level in range(int(xs.size).bit_length(), -1, -1):
        size = 1 << level
        takes = np.flatnonzero((counts - covered) >= size)  # queries whose prefix holds this level's block
        if takes.size == 0:
            continue
        keys = (np.arange(xs.size, dtype=np.int64) >> level) * span + shifted_y
        order = np.argsort(keys)  # ties need no order: only sums over ranges of keys are read
        sorted_keys = keys[order]
        running = np.concatenate(([0], np.cumsum(ws[order])))
        starts = (covered[takes] >> level) * span
        ends = starts + query_y[takes]
        by_end = np.argsort(ends)  # sorted probes search several times faster
        low = np.empty(takes.size, dtype=np.int64)
        high = np.empty(takes.size, dtype=np.int64)
        low[by_end] = np.searchsorted(sorted_keys, starts[by_end], side="left")
        high[by_end] = np.searchsorted(sorted_keys, ends[by_end], side="left")
        answers[takes] += running[high] - running[low]
        covered[takes] += size
    return answers
