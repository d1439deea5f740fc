"""Is a sequence computed the same, bit for bit, in one llama_decode with other sequences as alone?

Batching several requests into one `llama_decode` (issue 22) keeps the engine's promise (every
answer equal to the request computed alone) only where llama.cpp's kernels give a row the same
bits whatever else the batch holds. That depends on the weights' types, flash attention, weight
repacking, the CPU and the build, so it is measured, not assumed: this probe computes a few
prompts alone and together in one context (`kv_unified` off, one stream per sequence, as the
engine's NativeContext makes it) and compares the logits bit for bit.

- Answers: every sequence's prompt is computed alone, then the next token of 2..n sequences
  (ids 0..k-1, consecutive, so llama.cpp's `split_equal` puts them in one ubatch) is decoded
  in one batch, teacher-forced with the tokens the alone run chose, against one decode per
  sequence per step.
- Prompts: the prompts are cut into the same chunks alone and together (`chunk` tokens, never
  a lone one), and each round's chunks of equal length go in one batch; the
  logits at each chunk's end and a few answer tokens decoded alone afterwards (which read
  the KV the batch wrote) are compared.
- Splits: a prompt in chunks against the same prompt whole, both alone (whether a batched
  prompt may end its batches elsewhere than it would alone).

Nothing in the engine uses it yet: it is the measured ground for deciding which models and
settings may batch. `GGML_CPU_TILED_MM` is read once per process by llama.cpp, so a probe of
both of its values needs a process each (tools/batch_invariance_probe.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from chatapp.engine.batching import MIN_ROWS
from chatapp.engine.llama_native import NativeContext, NativeModel

# Texts whose prompts are 30-80 tokens with the bundled tokenizer: different lengths, so the
# sequences' KV spans differ (the masked cells beyond a shorter one's must add exact zeros).
PROBE_TEXTS = (
    "The lighthouse keeper wrote in his log every evening: the wind, the ships that passed, "
    "and the colour of the sea at dusk.",
    "Explain, in two short sentences, why a prefix cache must key each block by the hash of "
    "every token before it, and what goes wrong if it does not. Give one small example of a "
    "collision.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n\nprint([fibonacci(i) for i in range(10)])  # what does this print, and why?",
    "Dear team, the meeting moves to Thursday at ten. Please bring the figures for the third "
    "quarter and a list of the open questions.",
)


@dataclass(frozen=True)
class ProbeSettings:
    """The context settings a probe runs under (n_threads is also n_threads_batch, as the engine sets)."""

    flash_attention: bool = False
    repack: bool = True
    n_threads: int = 2
    answer_steps: int = 24
    chunk: int = 16
    n_ctx_per_sequence: int = 256
    # Shared tokens before every prompt. CPU flash attention computes a lone query row of a
    # single stream over 512 or more KV cells by splitting the cells between threads (ops.cpp,
    # use_split_kv_path), and a batch of several streams never does: short prompts cannot see it.
    prefix_tokens: int = 0


@dataclass
class Comparison:
    """Logit vectors compared bit for bit between a batched (or split) run and the alone run."""

    compared: int = 0
    differing: int = 0
    max_diff: float = 0.0
    first_difference: str = ""  # where the first differing vector was, for the report

    @property
    def identical(self) -> bool:
        return self.compared > 0 and self.differing == 0

    def add(self, alone: np.ndarray, other: np.ndarray, where: str) -> None:
        self.compared += 1
        if np.array_equal(alone, other):
            return
        self.differing += 1
        self.max_diff = max(self.max_diff, float(np.abs(alone - other).max()))
        if not self.first_difference:
            self.first_difference = where


@dataclass
class ProbeReport:
    """What a probe measured for one model under one setting; plain data (asdict) for JSON."""

    model: str
    settings: ProbeSettings
    flash_attention: bool  # as created: a build without flash attention falls back to off
    tiled_mm: str  # GGML_CPU_TILED_MM as this process saw it ("" when unset: on)
    prompt_lengths: list[int]
    answers: dict[int, Comparison] = field(default_factory=dict)  # by sequences decoded together
    answer_speed: dict[int, float] = field(default_factory=dict)  # per-token time together / alone
    prompts: Comparison = field(default_factory=Comparison)
    prompt_speed: float = 0.0  # prefill time together / alone (same chunks)
    alone_decode_tps: float = 0.0  # answer tokens per second, one sequence per decode (what a setting costs)
    alone_prefill_tps: float = 0.0  # prompt tokens per second, alone in chunks
    splits: Comparison = field(default_factory=Comparison)

    @property
    def answers_identical(self) -> bool:
        return bool(self.answers) and all(comparison.identical for comparison in self.answers.values())

    @property
    def answers_max_diff(self) -> float:
        return max((comparison.max_diff for comparison in self.answers.values()), default=0.0)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["answers_identical"] = self.answers_identical
        data["prompts_identical"] = self.prompts.identical
        data["splits_identical"] = self.splits.identical
        return data


@dataclass(frozen=True)
class Piece:
    """Tokens of one sequence in a batch, at positions start..; logits for its last token or not."""

    sequence: int
    start: int
    tokens: Sequence[int]
    logits: bool = True


def decode_together(context: NativeContext, pieces: Sequence[Piece]) -> list[np.ndarray | None]:
    """Evaluate several sequences' tokens in one llama_decode; each piece's last logits (None if not asked).

    NativeContext.decode takes one sequence; this is its several-sequence form. llama.cpp's
    split_equal (kv_unified off) takes an equal number of tokens from each of a run of
    consecutive sequence ids per ubatch, so pieces of equal length on consecutive ids, in
    order, share ubatches.
    """
    total = sum(len(piece.tokens) for piece in pieces)
    batch = llama_cpp.llama_batch_init(total, 0, 1)
    try:
        index = 0
        outputs: list[int | None] = []
        for piece in pieces:
            for offset, token in enumerate(piece.tokens):
                batch.token[index] = token
                batch.pos[index] = piece.start + offset
                batch.n_seq_id[index] = 1
                batch.seq_id[index][0] = piece.sequence
                batch.logits[index] = piece.logits and offset == len(piece.tokens) - 1
                index += 1
            outputs.append(index - 1 if piece.logits else None)
        batch.n_tokens = total
        status = llama_cpp.llama_decode(context.pointer, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status}")
        return [None if output is None else context.logits(output) for output in outputs]
    finally:
        llama_cpp.llama_batch_free(batch)


def _decode_alone(context: NativeContext, sequence: int, start: int, tokens: Sequence[int]) -> np.ndarray:
    context.decode(list(tokens), start_pos=start, sequence=sequence, logits_for_last=True)
    return context.logits()


def _clear(context: NativeContext, sequences: int) -> None:
    for sequence in range(sequences):
        context.remove(sequence, 0, -1)


def chunk_ends(length: int, chunk: int) -> list[int]:
    """Where the batches of a prompt of `length` end in pieces of `chunk` tokens, none of one token.

    A one-token batch takes matrix-vector kernels (batching.MIN_ROWS): a lone last token joins
    the piece before it, as the engine's batch_end never leaves one either.
    """
    ends = [*range(chunk, length, chunk), length]
    if len(ends) > 1 and ends[-1] - ends[-2] < MIN_ROWS:
        del ends[-2]
    return ends


def probe_answers(
    context: NativeContext, prompts: Sequence[Sequence[int]], steps: int
) -> tuple[dict[int, Comparison], dict[int, float], float]:
    """Answers of 2..n sequences decoded together against one decode per sequence per step.

    The context holds two sets of the n prompts, each computed alone (whole): the alone set on
    ids 0..n-1 decodes one sequence at a time, as the engine's turns do today, choosing each
    next token greedily; the together set on ids n..2n-1 decodes the first k of them in one
    batch (consecutive ids), teacher-forced with the alone set's tokens, so a difference at
    one step does not hide the next. Each step runs both, one after the other, so the time
    ratio (per token, together / alone; the median over steps) holds on a shared CPU.
    Between values of k both sets are cut back to their prompts. Also returns the answer
    tokens per second alone (median), what a setting costs.
    """
    count = len(prompts)
    _clear(context, 2 * count)
    first = [_decode_alone(context, sequence, 0, prompt) for sequence, prompt in enumerate(prompts)]
    for sequence, prompt in enumerate(prompts):
        _decode_alone(context, count + sequence, 0, prompt)
    comparisons: dict[int, Comparison] = {}
    ratios: dict[int, float] = {}
    alone_times: list[float] = []  # per token
    for together in range(2, count + 1):
        comparison = Comparison()
        step_ratios = []
        last = list(first[:together])
        for step in range(steps):
            tokens = [int(np.argmax(logits)) for logits in last]
            started = time.perf_counter()
            last = [
                _decode_alone(context, sequence, len(prompts[sequence]) + step, [tokens[sequence]])
                for sequence in range(together)
            ]
            alone_time = time.perf_counter() - started
            alone_times.append(alone_time / together)
            pieces = [Piece(count + s, len(prompts[s]) + step, [tokens[s]]) for s in range(together)]
            started = time.perf_counter()
            results = decode_together(context, pieces)
            step_ratios.append((time.perf_counter() - started) / alone_time)
            for sequence, logits in enumerate(results):
                assert logits is not None
                comparison.add(last[sequence], logits, f"sequence {sequence}, step {step}")
        comparisons[together] = comparison
        ratios[together] = float(np.median(step_ratios))
        for sequence, prompt in enumerate(prompts):
            context.remove(sequence, len(prompt), -1)
            context.remove(count + sequence, len(prompt), -1)
    return comparisons, ratios, 1 / float(np.median(alone_times))


def probe_prompts(
    context: NativeContext, prompts: Sequence[Sequence[int]], chunk: int, verify_steps: int = 4
) -> tuple[Comparison, float, Comparison, float]:
    """Prompt chunks of several sequences in one batch against each prompt alone in the same chunks.

    Round by round, the alone set (ids 0..n-1) computes every sequence's next chunk alone and
    the together set (ids n..2n-1) the same chunks with those of equal length in one batch (a
    shorter last chunk goes with those of its length, or alone): never mixed lengths, which
    split_equal would cut again. Compared: the logits at every chunk's end, then
    `verify_steps` answer tokens decoded alone after the prompt (they read the KV the batches
    wrote). Also returns the prefill time ratio (together / alone, same chunks) and the splits
    comparison: the prompt whole against in chunks, both alone (whether where a batch ends
    matters at all), and the alone prefill's tokens per second.
    """
    count = len(prompts)
    cuts = [chunk_ends(len(prompt), chunk) for prompt in prompts]
    _clear(context, 2 * count)
    alone_chunks: list[list[np.ndarray]] = [[] for _ in prompts]
    together_chunks: list[list[np.ndarray]] = [[] for _ in prompts]
    spent_alone = spent_together = 0.0
    for round_index in range(max(len(ends) for ends in cuts)):
        by_length: dict[int, list[Piece]] = {}
        started = time.perf_counter()
        for sequence, ends in enumerate(cuts):
            if round_index < len(ends):
                start = ends[round_index - 1] if round_index else 0
                tokens = prompts[sequence][start : ends[round_index]]
                alone_chunks[sequence].append(_decode_alone(context, sequence, start, tokens))
                by_length.setdefault(len(tokens), []).append(Piece(count + sequence, start, tokens))
        spent_alone += time.perf_counter() - started
        for pieces in by_length.values():
            started = time.perf_counter()
            results = decode_together(context, pieces)
            spent_together += time.perf_counter() - started
            for piece, logits in zip(pieces, results, strict=True):
                assert logits is not None
                together_chunks[piece.sequence - count].append(logits)

    def continue_alone(
        sequence: int, first: np.ndarray, tokens: list[int] | None
    ) -> tuple[list[np.ndarray], list[int]]:
        """Decode `verify_steps` tokens alone after the prompt in `sequence`: greedy, or the `tokens` given."""
        logits, chosen, last = [], [], first
        length = len(prompts[sequence % count])
        for step in range(verify_steps):
            token = int(np.argmax(last)) if tokens is None else tokens[step]
            chosen.append(token)
            last = _decode_alone(context, sequence, length + step, [token])
            logits.append(last)
        return logits, chosen

    comparison = Comparison()
    after_alone = []
    for sequence in range(count):
        for index, (alone, together) in enumerate(zip(alone_chunks[sequence], together_chunks[sequence], strict=True)):
            comparison.add(alone, together, f"sequence {sequence}, chunk {index}")
        after_alone.append(continue_alone(sequence, alone_chunks[sequence][-1], None))
        after, _ = continue_alone(count + sequence, together_chunks[sequence][-1], after_alone[sequence][1])
        for step, (alone, together) in enumerate(zip(after_alone[sequence][0], after, strict=True)):
            comparison.add(alone, together, f"sequence {sequence}, answer step {step} after the prompt")

    _clear(context, count)
    splits = Comparison()
    for sequence, prompt in enumerate(prompts):
        whole = _decode_alone(context, sequence, 0, prompt)
        splits.add(alone_chunks[sequence][-1], whole, f"sequence {sequence}, prompt end")
        after, _ = continue_alone(sequence, whole, after_alone[sequence][1])
        for step, (alone, other) in enumerate(zip(after_alone[sequence][0], after, strict=True)):
            splits.add(alone, other, f"sequence {sequence}, answer step {step} after the prompt")
    return comparison, spent_together / spent_alone, splits, sum(map(len, prompts)) / spent_alone


def probe_prompt_tokens(model: NativeModel, texts: Sequence[str] = PROBE_TEXTS, prefix: int = 0) -> list[list[int]]:
    """The probe's prompts in `model`'s vocabulary (with its BOS where it adds one), after `prefix` shared tokens."""
    filler: list[int] = []
    while len(filler) < prefix:
        filler += model.tokenize(" ".join(texts), add_special=False, parse_special=False)
    prompts = [model.tokenize(text, add_special=True, parse_special=False) for text in texts]
    head = 1 if model.add_bos else 0
    return [[*prompt[:head], *filler[:prefix], *prompt[head:]] for prompt in prompts]


def probe(model_path: Path, settings: ProbeSettings, texts: Sequence[str] = PROBE_TEXTS) -> ProbeReport:
    """Load `model_path` under `settings` and measure answers, prompts and splits (see the module docstring)."""
    model = NativeModel(model_path, repack=settings.repack)
    try:
        prompts = probe_prompt_tokens(model, texts, settings.prefix_tokens)
        context = NativeContext(
            model,
            n_sequences=2 * len(prompts),  # an alone set and a together set (probe_answers)
            n_ctx_per_sequence=settings.n_ctx_per_sequence,
            n_threads=settings.n_threads,
            n_batch=max(512, *map(len, prompts)),  # each prompt whole in one batch (the alone runs)
            flash_attention=settings.flash_attention,
        )
        try:
            flash = context.shape.flash_attention
            report = ProbeReport(
                model=model_path.name,
                settings=settings,
                flash_attention=flash,
                tiled_mm=os.environ.get("GGML_CPU_TILED_MM", ""),
                prompt_lengths=[len(prompt) for prompt in prompts],
            )
            report.answers, report.answer_speed, report.alone_decode_tps = probe_answers(
                context, prompts, settings.answer_steps
            )
            report.prompts, report.prompt_speed, report.splits, report.alone_prefill_tps = probe_prompts(
                context, prompts, settings.chunk
            )
            return report
        finally:
            context.close()
    finally:
        model.close()
