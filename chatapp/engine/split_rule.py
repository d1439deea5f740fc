"""Whether a prompt's KV depends on where its batches end: free batches, or a fixed grid.

On most CPU builds a token's KV is the same bits however the prompt is cut into batches (the
bundled SmolLM2: every split tried, 0.0 apart), and a prefix may be reused at any token. Not
everywhere: Gemma 3 270M's tinyBLAS path gives logits up to 0.95 apart when the same 100
tokens are split 5+95, 37+63 or 97+3 instead of computed whole (and equal for 64+36 or
67+33; 48 tokens split 21+27: 0.41 apart, while 2+46 and 5+43 agree), and GPU kernels
are chosen by the number of rows. There a prefix continued in place, or restored, is exact
only if its batches were the ones a cold run uses: such a model computes every prompt on a
fixed grid (batching.GRID_TOKENS).

The probe computes one short prompt whole and split at five places, and a longer one whole and
split near its middle, last logits compared bit for bit (about 550 tokens of prefill), once per
model file, build, CPU and settings (verdict_memo.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from chatapp.engine.batching import MIN_ROWS
from chatapp.engine.llama_native import NativeContext, NativeModel
from chatapp.engine.verdict_memo import recall, remember

log = logging.getLogger(__name__)

PROBE_TEXT = "The quick brown fox jumps over the lazy dog while the river runs down to the sea. " * 40
PROBE_TOKENS = 48
# And once longer, split near its middle: kernels may change with a batch's size.
LONG_PROBE_TOKENS = 128
# Where the probe cuts its prompt, as first batch sizes and last batch sizes: odd and even, small and
# larger (Gemma 3 270M differed at 2, 5 and 37 first and 3, 10 and 31 last, agreed at 64+36 and 67+33).
FIRST_BATCHES = (2, 5, 21)
LAST_BATCHES = (3, 10)


def split_problem(model: NativeModel, context: NativeContext, min_rows: int) -> str | None:
    """The first split of a short prompt whose last logits differ from the prompt computed whole, or None.

    Every batch has at least `min_rows` tokens (flash attention's rule). Uses sequence 0 and
    clears it afterwards.
    """
    room = min(context.shape.n_batch, context.shape.n_ctx_per_sequence)  # one batch, within one sequence
    text = model.tokenize(PROBE_TEXT, add_special=True, parse_special=False)[:room]
    if min_rows > MIN_ROWS:  # flash attention's rows: two cuts that leave batches of at least that many
        length = min(len(text), 2 * min_rows + 40)
        cuts = [min_rows + 7, length - min_rows - 9]
    else:
        length = min(len(text), PROBE_TOKENS)
        cuts = [*FIRST_BATCHES, *(length - last for last in LAST_BATCHES)]
    trials = [(length, cut) for cut in sorted(set(cuts)) if min_rows <= cut <= length - min_rows]
    long = min(len(text), max(LONG_PROBE_TOKENS, length + 1))
    if long > length:
        trials.append((long, long // 2 - 3))
    wholes: dict[int, np.ndarray] = {}
    try:
        for size, cut in trials:
            tokens = text[:size]
            if size not in wholes:
                wholes[size] = context.logits_split_at(tokens, [])
            whole = wholes[size]
            split = context.logits_split_at(tokens, [cut])
            if not np.array_equal(split, whole):
                apart = float(np.abs(split - whole).max())
                return f"{size} prompt tokens computed as {cut}+{size - cut} end {apart:.2g} apart from whole"
        return None
    finally:
        context.remove(0, 0, -1)


def fixed_batches(
    model: NativeModel, context: NativeContext, *, gpu_layers: int, min_rows: int, key: str, memo: Path | None
) -> str | None:
    """Why this model computes prompts on the fixed grid (None: batches may end anywhere).

    Offloaded layers always do (GPU kernels are chosen by row count); otherwise the probe
    decides, remembered in `memo` under `key`. A probe that cannot run is a yes: when in doubt,
    the grid, which is exact whatever the kernels do.
    """
    if gpu_layers > 0:
        return "GPU kernels are chosen by the number of rows"
    key = f"splits|{context.shape.n_batch}|{key}"  # the probe's lengths depend on n_batch
    known = recall(key, memo)
    if known is not None:
        return known or None
    try:
        problem = split_problem(model, context, min_rows)
    except RuntimeError as error:
        log.info("prompts are computed on a fixed grid: the split probe could not run (%s)", error)
        return f"the split probe could not run ({error})"
    remember(key, problem or "", memo)
    if problem:
        log.info("prompts are computed on a fixed grid of batches: %s", problem)
    return problem
