"""Whether answers of several requests may share one llama_decode and stay exact.

Batching is usually not bit-exact: llama.cpp's CPU kernels are chosen by the number of rows.
Measured on x86 (batch_probe.py, tools/batch_invariance_probe.py): with flash attention off,
weights in Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (and repacked IQ4_NL) give every row bit-identical
results whatever else the batch holds. K-quants change kernel at 8 rows and, repacked, by a row's
place in a group of 4; F16/BF16/F32 weights differ between one row and several; CPU flash
attention splits one row's KV range across threads. GPU kernels are picked by row count too, but
not on every device alike: there the probe alone decides (it must find no difference).

So the rule looks at the weight types of every matrix the model multiplies by (K-quants pass it:
most Q4_0 and Q5_0 files keep their output projection in Q6_K, and unrepacked K-quants hold below
8 rows; offloaded weights run the device's kernels, not these) and flash attention; a model that
passes is then confirmed on its own context by a short probe: answers of every group size up to
MAX_TOGETHER (or the sequences it has), so every row place in every size, alone then together,
logits compared bit for bit. A tiny Q4_K_M model (Q4_K repacked on AVX2) agreed at 2 and 3
together and differed at 4. The verdict is remembered per model file, llama.cpp build, CPU and
settings. Only a confirmed model batches.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import numpy as np

from chatapp.engine.config import LoadProgress
from chatapp.engine.kv_types import KvType
from chatapp.engine.llama_native import NativeContext, NativeModel, offload_device
from chatapp.engine.requests import SamplingParams
from chatapp.engine.sampling import NativeSampler
from chatapp.engine.verdict_memo import recall, remember
from chatapp.errors import LoadCancelled
from chatapp.models.file_types import GGML_TYPES, ggml_type_name
from chatapp.models.gguf_header import GgufError, read_header

log = logging.getLogger(__name__)

# ggml types whose CPU matmul gives a row the same bits alone or beside others (flash attention off).
INVARIANT_WEIGHT_TYPES = frozenset(GGML_TYPES[name] for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL"))
# K-quants: the same below 8 rows unless this CPU's llama.cpp repacks them, when a row's result
# may depend on its place in a group of 4: the probe tells (every group size, every place).
K_QUANT_TYPES = frozenset(GGML_TYPES[name] for name in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"))
# Tensors of two or more dimensions no matmul reads: recurrent and hybrid models' convolution kernels
# (Mamba, LFM2) and state decays, applied per sequence (ggml_ssm_conv, ggml_ssm_scan), not by row.
NOT_MULTIPLIED = ("ssm_conv1d.weight", "shortconv.conv.weight", ".ssm_a", ".ssm_d")
# Answers evaluated in one decode at most: K-quant kernels change at 8 rows (the tiled path).
MAX_TOGETHER = 7
PROBE_TEXTS = (
    "The capital of France is",
    "def add(a, b):\n    return",
    "Once upon a time, in a",
    "The three primary colours are",
    "SELECT name FROM users WHERE",
    "Dear Sir or Madam, I am writing",
    "1, 1, 2, 3, 5, 8,",
)
PROBE_STEPS = 2  # differences showed at the first step batched (F16, a repacked Q4_K_M)


def weights_problem(model_path: Path) -> str | None:
    """Why the model's matrix weights are not batch-invariant (None when every one is of a type that is)."""
    try:
        header = read_header(model_path)
    except (GgufError, OSError) as error:
        return f"its tensor types could not be read ({error})"
    names = {tensor.name for tensor in header.tensors}
    tied_output = "output.weight" not in names  # token_embd is then also the output projection
    for tensor in header.tensors:
        if len(tensor.shape) < 2 or (tensor.name.startswith("token_embd") and not tied_output):
            continue  # norms and biases, and an embedding only looked up
        if tensor.name.endswith(NOT_MULTIPLIED):
            continue  # a convolution's kernel or a state's decay: applied per sequence, not by a matmul
        if tensor.ggml_type not in INVARIANT_WEIGHT_TYPES and tensor.ggml_type not in K_QUANT_TYPES:
            return f"{tensor.name} is {ggml_type_name(tensor.ggml_type)}, whose kernels depend on the batch's size"
    return None


def rule_problem(model: NativeModel, context: NativeContext, gpu_layers: int) -> str | None:
    """Why this model and context must not batch answers, by the rule alone (None: probe it)."""
    if context.shape.n_sequences < 2:
        return "one sequence: nothing to batch"
    if context.shape.flash_attention:
        return "flash attention splits one row's work across threads unlike several rows'"
    if gpu_layers > 0:
        return None  # the device's kernels, whatever the weights' types: the probe decides
    return weights_problem(model.path)


def probe_problem(model: NativeModel, context: NativeContext, progress: LoadProgress | None = None) -> str | None:
    """Answers of k = 2..n sequences decoded alone and together on this context (n: the sequences it
    has, at most MAX_TOGETHER): the first difference, or None.

    Greedy, teacher-forced by the alone run; every sequence used is cleared afterwards. `progress`
    hears the share done after each step; False from it stops the probe (LoadCancelled).
    """
    count = min(context.shape.n_sequences, MAX_TOGETHER, len(PROBE_TEXTS))
    prompts = [model.tokenize(text, add_special=True, parse_special=False) for text in PROBE_TEXTS[:count]]
    steps = count + (count - 1)  # each answer alone, then each group size together
    done = 0

    def step_done() -> None:
        nonlocal done
        done += 1
        if progress is not None and not progress(done / steps):
            raise LoadCancelled(f"loading {model.path.name} was cancelled")

    try:
        alone = []
        for index, prompt in enumerate(prompts):
            alone.append(_answer_alone(model, context, index, prompt))
            step_done()
        for size in range(2, count + 1):
            for index, prompt in enumerate(prompts[:size]):  # back to the prompt, computed alone
                if model.memory.updates_in_place:  # a recurrent state cannot be cut: computed again
                    context.remove(index, 0, -1)
                    decode_prompt(context, prompt, index)
                else:
                    context.remove(index, len(prompt), -1)
            for step in range(PROBE_STEPS):
                entries = [(alone[index][0][step], len(prompts[index]) + step, index) for index in range(size)]
                context.decode_answers(entries)
                for index in range(size):
                    if not np.array_equal(context.logits(index), alone[index][1][step + 1]):
                        return f"sequence {index}'s logits at answer step {step + 1} of {size} together differ"
            step_done()
        return None
    finally:
        for index in range(count):
            context.remove(index, 0, -1)


def _answer_alone(
    model: NativeModel, context: NativeContext, sequence: int, prompt: Sequence[int]
) -> tuple[list[int], list[np.ndarray]]:
    """PROBE_STEPS greedy tokens decoded one at a time, with the logits before each (and after the last);
    the sequence keeps its prompt's KV."""
    context.remove(sequence, 0, -1)
    decode_prompt(context, prompt, sequence)
    sampler = NativeSampler(SamplingParams(temperature=0.0), model)
    tokens: list[int] = []
    logits = [context.logits()]
    try:
        for step in range(PROBE_STEPS):
            tokens.append(sampler.sample(context))
            context.decode([tokens[-1]], start_pos=len(prompt) + step, sequence=sequence, logits_for_last=True)
            logits.append(context.logits())
    finally:
        sampler.close()
    return tokens, logits


def decode_prompt(context: NativeContext, prompt: Sequence[int], sequence: int) -> None:
    """The prompt in batches of the context's size (the same ones alone and before batching), logits for
    its last token."""
    size = context.shape.n_batch
    for start in range(0, len(prompt), size):
        chunk = list(prompt[start : start + size])
        context.decode(chunk, start_pos=start, sequence=sequence, logits_for_last=start + size >= len(prompt))


def verdict_key(
    model_path: Path,
    *,
    threads: int,
    flash_attention: bool,
    gpu_layers: int,
    sequences: int,
    swa_full: bool,
    kv_type: KvType = KvType.F16,
) -> str:
    """What the probe's verdict depends on: the file, the build and CPU, the context's settings (as
    asked for: known before the weights are loaded, so a load knows whether it will probe), and the
    group sizes probed (a verdict for 3 sequences says nothing of 4 together), and the device layers run on."""
    stat = model_path.stat()
    system = llama_cpp.llama_print_system_info().decode("utf-8", "replace")
    parts = (model_path.resolve(), stat.st_size, stat.st_mtime_ns, llama_cpp.__version__, system, threads)
    settings = (flash_attention, gpu_layers, min(sequences, MAX_TOGETHER, len(PROBE_TEXTS)), swa_full)
    device = (offload_device(),) if gpu_layers else ()  # another GPU, other kernels
    cells = (kv_type.value,) if kv_type.quantized else ()  # f16 keys stay as they were before the setting
    return "|".join(str(part) for part in (*parts, *settings, *device, *cells))


def verdict_known(key: str, memo: Path | None) -> bool:
    """Whether a load with this key finds its verdict (this process's, or the memo's) rather than probing."""
    return recall(key, memo) is not None


def answer_batching(
    model: NativeModel,
    context: NativeContext,
    gpu_layers: int,
    key: str,
    memo: Path | None,
    progress: LoadProgress | None = None,
) -> tuple[bool, str | None]:
    """Whether to batch answers here, and why not: the rule, then the probe (remembered in `memo`
    under `key`; `progress` hears the probe's share done, and False from it stops the load)."""
    if problem := rule_problem(model, context, gpu_layers):
        return False, problem
    known = recall(key, memo)
    if known is not None:
        problem = known or None
    else:
        try:
            problem = probe_problem(model, context, progress)
        except RuntimeError as error:  # no batching, never a failed load; not a verdict: probed again next load
            log.info("answers are not batched: the probe could not run (%s)", error)
            return False, f"the probe could not run ({error})"
    remember(key, problem or "", memo)  # this process's verdict is this folder's too
    if problem:
        log.info("answers are not batched: %s", problem)
    return problem is None, problem
