"""What one llama.cpp batch of several requests' prompts costs against computing them one after another.

The engine batches answers (one token per sequence: one decode instead of several) but computes
prompts one at a time, shortest remaining first (turns.py): on a CPU a batch of several prompts
costs about what they cost one after another, so it would only hold the first request's first
token until the last one's is ready. The bench's figure N measures it on the machine at hand.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import llama_cpp

from chatapp.engine.batch_probe import Piece, decode_together
from chatapp.engine.llama_native import NativeContext, NativeModel

PROMPTS_TOGETHER = 3  # requests whose new prompt tokens are measured in one batch


def prompts_together_ratio(
    model_path: Path, *, threads: int, n_batch: int, held: int, new_tokens: int, rounds: int
) -> float:
    """One decode of PROMPTS_TOGETHER prompts' `new_tokens` each / the same decoded one after another
    (median of `rounds`), each sequence holding `held` random tokens first (one computed, copied)."""
    rng = random.Random(22)
    model = NativeModel(model_path)
    try:
        context = NativeContext(
            model,
            n_sequences=PROMPTS_TOGETHER,
            n_ctx_per_sequence=held + new_tokens + 16,
            n_threads=threads,
            n_batch=max(n_batch, PROMPTS_TOGETHER * new_tokens),
        )
        try:
            tokens = range(100, min(model.n_vocab, 30_000))
            prefix = [rng.choice(tokens) for _ in range(held)]
            for start in range(0, held, n_batch):
                context.decode(prefix[start : start + n_batch], start_pos=start, sequence=0, logits_for_last=False)
            for sequence in range(1, PROMPTS_TOGETHER):
                llama_cpp.llama_memory_seq_cp(context.memory, 0, sequence, -1, -1)
            news = [[rng.choice(tokens) for _ in range(new_tokens)] for _ in range(PROMPTS_TOGETHER)]

            def one_after_another() -> None:
                for sequence, new in enumerate(news):
                    context.decode(new, start_pos=held, sequence=sequence, logits_for_last=True)

            def together() -> None:
                decode_together(context, [Piece(sequence, held, new) for sequence, new in enumerate(news)])

            ratios = []
            for number in range(rounds):  # each goes first in turn
                if number % 2:
                    alone = _seconds(context, held, one_after_another)
                    ratios.append(_seconds(context, held, together) / alone)
                else:
                    batched = _seconds(context, held, together)
                    ratios.append(batched / _seconds(context, held, one_after_another))
            return statistics.median(ratios)
        finally:
            context.close()
    finally:
        model.close()


def _seconds(context: NativeContext, held: int, work: Callable[[], None]) -> float:
    """How long `work` takes, every sequence first cut back to its `held` tokens."""
    for sequence in range(PROMPTS_TOGETHER):
        context.remove(sequence, held, -1)
    started = time.perf_counter()
    work()
    return time.perf_counter() - started
