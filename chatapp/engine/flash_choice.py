"""Flash attention where one user is served: on where it makes this model faster on this machine.

llama-server turns flash attention on wherever the device has it. chatapp pays for it in two ways:
with it on, answers of several clients no longer batch exactly (batch_rule.py), and every answer
computes its last FLASH_ATTENTION_ROWS prompt tokens again (prompts shorter than that are not
reused; batching.py). Its gain depends on the model, the kernels and the CPU: on one AVX-512 EPYC
chatapp's prefill was 0.96-1.17x as fast with it, with the AVX2 kernels of the same CPU 1.32x.

So `auto` keeps it off where several clients' answers may batch (a server with more than one
sequence and answer batching on), and for models whose state is not plain KV (`unmeasured_kind`).
Elsewhere (the TUI, `ask`, a server of one sequence) it is measured once per model file, build, CPU
and settings: a short prefill and decode on a small
context with it off and on, alternated, in two rounds (one where a round is slow). It is on where
every round finds it at least FLASH_WORTH as fast in one and keeping FLASH_LOSS_ALLOWED of the speed
in the other, the rule bench P's advice line uses. The verdict is remembered like the batching
probe's (verdict_memo.py).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from cache.memory_kinds import Memory
from chatapp.engine.batch_rule import decode_prompt, verdict_key, weights_problem
from chatapp.engine.config import FlashSetting, LoadProgress
from chatapp.engine.kv_types import KvType
from chatapp.engine.llama_native import NativeContext, NativeModel
from chatapp.engine.verdict_memo import recall, remember
from chatapp.errors import LoadCancelled

log = logging.getLogger(__name__)

# On where it is at least this much faster in prefill or decode and keeps this share of the other's speed:
# one run's noise is several percent, and the gain must pay for the prompt tokens it computes again.
FLASH_WORTH = 1.10
FLASH_LOSS_ALLOWED = 0.97
MEASURE_CONTEXT = 512
MEASURE_PROMPT_TOKENS = 128  # two of flash attention's 64-row tiles
MEASURE_DECODE_TOKENS = 12
MEASURE_ROUNDS = 2
# A first round (off and on) that took this long is long enough to judge by: a large model on a CPU
# does not measure for a minute.
ONE_ROUND_ENOUGH_S = 8.0
MEASURE_TEXT = "The lighthouse keeper wrote down the weather, the ships that passed and the state of the lamp. "
# CHATAPP_FLASH_AUTO=off makes `auto` off wherever it would measure: runs that must not depend on
# this machine's measurement (the test suite, whose reuse counts differ with flash attention on).
AUTO_ENV = "CHATAPP_FLASH_AUTO"


@dataclass(frozen=True)
class FlashChoice:
    """Whether flash attention is on for this load, and why, in a few words (status line, /metrics)."""

    on: bool
    why: str
    rounds: tuple[tuple[float, float], ...] = ()  # a measurement's prefill and decode gains, round by round


def flash_pays(prefill_gain: float, decode_gain: float) -> bool:
    """Whether speeds on / off of `prefill_gain` and `decode_gain` are worth flash attention's costs."""
    gains = (prefill_gain, decode_gain)
    return max(gains) >= FLASH_WORTH and min(gains) >= FLASH_LOSS_ALLOWED


def decided_flash(
    setting: FlashSetting, *, kv_type: KvType, serves_many: bool, batch_answers: bool, sequences: int, model: Path
) -> FlashChoice | None:
    """The choice known before the weights load; None where `auto` measures this model."""
    if kv_type.quantized:
        return FlashChoice(True, f"the {kv_type.value} KV cache needs it")
    if setting is not True and setting is not False and setting != "auto":
        raise ValueError(f"flash attention is on, off or auto, not {setting!r}")
    if setting != "auto":
        return FlashChoice(bool(setting), "as set")
    if serves_many and batch_answers and sequences > 1 and weights_problem(model) is None:
        return FlashChoice(False, "several clients' answers batch exactly with it off")
    if os.environ.get(AUTO_ENV, "").strip().lower() == "off":
        return FlashChoice(False, f"auto, off by {AUTO_ENV}")
    return None


def unmeasured_kind(memory: Memory) -> FlashChoice | None:
    """Off without measuring where the suite has not checked this memory kind's restores with flash
    attention on a CPU (`Memory.flash_attention_checked`); None: measure."""
    if memory.flash_attention_checked:
        return None
    return FlashChoice(
        False, f"auto keeps it off for {memory.kind.value} models (their restores are checked without it)"
    )


def flash_key(model: Path, *, threads: int, gpu_layers: int, swa_full: bool) -> str:
    """What the measurement depends on: the file, the build and CPU, threads and the device's layers."""
    return "flash-speed|" + verdict_key(
        model, threads=threads, flash_attention=False, gpu_layers=gpu_layers, sequences=1, swa_full=swa_full
    )


def recalled_flash(key: str, memo: Path | None) -> FlashChoice | None:
    """A measurement remembered under `key`, or None."""
    verdict = recall(key, memo)
    if not verdict:
        return None
    on, _, why = verdict.partition("|")
    return FlashChoice(on == "on", why)


def measure_flash(
    model: NativeModel,
    key: str,
    memo: Path | None,
    *,
    threads: int,
    n_batch: int,
    swa_full: bool,
    progress: LoadProgress | None = None,
) -> FlashChoice:
    """Prefill and decode speed with flash attention off and on, alternated, in MEASURE_ROUNDS rounds; on only
    where every round's gains pay (`flash_pays`): a measurement disturbed by other work on the machine,
    remembered for good, must not turn it on (off costs nothing it had). Remembered under `key`;
    `progress` hears the share done, and False from it stops the load (LoadCancelled)."""
    runs = [flash for _ in range(MEASURE_ROUNDS) for flash in (False, True)]
    speeds: list[list[float]] = []
    started = time.perf_counter()
    for done, flash in enumerate(runs):
        if done == 2 and time.perf_counter() - started > ONE_ROUND_ENOUGH_S:
            break
        measured = _speeds(model, flash, threads=threads, n_batch=n_batch, swa_full=swa_full)
        if measured is None:
            choice = FlashChoice(False, "this build has no flash attention for this model")
            remember(key, f"off|{choice.why}", memo)
            return choice
        speeds.append(measured)
        if progress is not None and not progress((done + 1) / len(runs)):
            raise LoadCancelled(f"loading {model.path.name} was cancelled")
    rounds = [(on[0] / off[0], on[1] / off[1]) for off, on in zip(speeds[0::2], speeds[1::2], strict=True)]
    on = all(flash_pays(*gains) for gains in rounds)
    prefill = " and ".join(f"{gains[0]:.2f}x" for gains in rounds)
    decode = " and ".join(f"{gains[1]:.2f}x" for gains in rounds)
    choice = FlashChoice(on, f"measured: prefill {prefill}, decode {decode} its speed off", tuple(rounds))
    log.info("flash attention %s (%s)", "on" if on else "off", choice.why)
    remember(key, f"{'on' if on else 'off'}|{choice.why}", memo)
    return choice


def _speeds(model: NativeModel, flash: bool, *, threads: int, n_batch: int, swa_full: bool) -> list[float] | None:
    """Prompt and answer tokens per second on a small context of one sequence (None: no flash attention)."""
    context = NativeContext(
        model,
        n_sequences=1,
        n_ctx_per_sequence=MEASURE_CONTEXT,
        n_threads=threads,
        n_batch=n_batch,
        flash_attention=flash,
        swa_full=swa_full,
    )
    try:
        if context.shape.flash_attention != flash:
            return None
        text = model.tokenize(MEASURE_TEXT, add_special=False, parse_special=False)
        prompt = (text * (MEASURE_PROMPT_TOKENS // max(len(text), 1) + 1))[:MEASURE_PROMPT_TOKENS]
        started = time.perf_counter()
        decode_prompt(context, prompt, 0)
        prompted = time.perf_counter()
        for offset in range(MEASURE_DECODE_TOKENS):
            token = prompt[offset % len(prompt)]
            context.decode([token], start_pos=len(prompt) + offset, sequence=0, logits_for_last=True)
        answered = time.perf_counter()
    finally:
        context.close()
    return [len(prompt) / (prompted - started), MEASURE_DECODE_TOKENS / (answered - prompted)]
