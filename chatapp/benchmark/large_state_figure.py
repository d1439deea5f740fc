"""Figure W: one large prefix (gigabytes on a large model) stored and restored: memory, time, answers.

On the model the bench is given (a wide-KV one: `python tools/wide_model.py PATH` writes a
random-weight model whose KV is shaped like an 8B model's, 128 KiB a token, small enough to
compute on a laptop), one document prompt of `prefix_tokens` tokens is answered with nothing
cached, which stores its state; then restored from the RAM tier's whole state, from disk with
the page cache warm, from disk with the cache folder's pages dropped, and from disk with the RAM
tier's budget a quarter of the state (as a 4 GiB prefix meets the default 2 GiB budget: RAM keeps
the first blocks, the rest pass through). For each step: the process's peak RSS (VmHWM, reset
before the step), in states, over the yardstick below (on the RAM-below path, less the blocks RAM
keeps within its lowered budget; elsewhere the whole state RAM keeps is the one copy counted);
its time against llama.cpp's own load of the state from memory and against reading the same
bytes from one file; and whether the answer's logits equal those of the prompt computed with no
cache, whose peak RSS is also the yardstick (the model, the KV cells and the compute buffers of
long batches, which a short question would leave out).
Besides, the decode speed of another conversation while the state is written to disk, against
the same decode with the writer idle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from chatapp.benchmark.goals import Verdict, large_state_verdicts
from chatapp.benchmark.memory import proc_status_bytes
from chatapp.benchmark.peers import PeerSettings, close_engine, open_chatapp_engine
from chatapp.benchmark.restore_figure import can_drop_pages, drop_pages, sequential_read_ms
from chatapp.benchmark.workloads import PromptKit
from chatapp.engine.contract import AnswerText, GenerationRequest, GenerationResult, LocalEngine, SamplingParams
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import ReuseTier, Role

LARGE_NAME = "W"
LARGE_CONTEXT = 8192
LARGE_PREFIX_TOKENS = 7_400
RESTORE_PATHS = ("ram, whole state", "disk, warm", "disk, cold", "disk, RAM below")
RAM_BELOW_SHARE = 4  # "disk, RAM below": the RAM tier's budget is this fraction of the state
MIN_DURING = 16  # tokens decoded during the store that time its rate alone
DECODE_TOKENS = 192
T = TypeVar("T")


@dataclass(frozen=True)
class LargeRestore:
    ms: float
    peak_states: float  # the step's peak RSS over the baseline's, in states (RAM below: less the blocks it keeps)
    equal_to_cold: bool
    read_ms: float = 0.0  # of `ms`, the blocks read and copied into the state (RestoreTimings.read_ms)
    load_ms: float = 0.0  # of `ms`, llama.cpp taking the state


@dataclass(frozen=True)
class LargeStateFigures:
    prefix_tokens: int
    state_bytes: int
    baseline_peak_bytes: int  # the same prompt computed with no cache: model, KV cells, compute buffers
    store_peak_states: float  # the storing run's peak RSS over the baseline's, in states
    store_equal_to_cold: bool
    store_s: float  # from the answer's end until the state is on disk
    restores: dict[str, LargeRestore]
    ready_load_ms: float  # llama.cpp loading the whole state from memory (the RAM restore's load step)
    read_cold_ms: float | None  # the same bytes read from one file, cold (None: pages cannot be dropped)
    read_warm_ms: float | None  # the same, from the page cache
    decode_idle_tps: float
    decode_storing_tps: float
    decode_during_store_share: float  # of the measured decode, the share that ran while the state was written
    elapsed_s: float


def measure_large_state(
    settings: PeerSettings, kit: PromptKit, folder: Path, *, prefix_tokens: int = LARGE_PREFIX_TOKENS
) -> LargeStateFigures:
    """Store one large prefix, then restore it by each path, each step's peak memory and time measured."""
    started = time.perf_counter()
    settings = replace(
        settings,
        context=max(settings.context, LARGE_CONTEXT),
        chatapp_sequences=2,
        ram_budget_bytes=max(settings.ram_budget_bytes, 4 << 30),
        disk_budget_bytes=max(settings.disk_budget_bytes, 8 << 30),
    )
    document = kit.texts.persona(11, prefix_tokens)

    def prompt(question: int, system: str = document) -> tuple[int, ...]:
        return kit.build(
            [ChatMessage.of(Role.SYSTEM, system), ChatMessage.of(Role.USER, kit.texts.question(question, 12))]
        )

    target = prompt(2)
    engine = open_chatapp_engine(settings, folder)
    try:
        cache = engine.cache
        assert cache is not None
        reference, baseline_peak = _peak_of(lambda: _answer(engine, target, use_cache=False, sequence=0))
        idle_before, _ = _decode_rate(engine, prompt(3, "Count slowly."), None)
        storing = _StoreWatch(engine)

        def store() -> tuple[GenerationResult, float, float]:
            """The answer, then another conversation's decode while its state is written, until it is on disk."""
            answer = storing.began_after(_answer(engine, target, sequence=0))
            rate, share = _decode_rate(engine, prompt(3, "Count slowly."), storing)
            engine.flush_cache()
            return answer, rate, share

        (cold, decode_storing, share), store_peak = _peak_of(store)
        store_s = storing.end()
        idle_after, _ = _decode_rate(engine, prompt(3, "Count slowly."), None)
        decode_idle = (idle_before + idle_after) / 2  # the machine's pace drifts: idle on both sides of the store
        restored = int(cold.stats.prompt_tokens)
        state = restored * cache.layout.bytes_per_cell
        restores: dict[str, LargeRestore] = {}
        load_ms = 0.0
        for path in RESTORE_PATHS:
            if path == "disk, cold" and not can_drop_pages():
                continue
            _empty_for(engine, target, path)  # before the peak is reset: the last path's memory is let go first
            (result, kept_by_budget), peak = _peak_of(partial(_restore, engine, target, path, state))
            timings = result.stats.restore
            assert timings is not None
            load_ms = timings.load_ms if path == RESTORE_PATHS[0] else load_ms
            equal = result.stats.logits_digest == reference.stats.logits_digest != ""
            restores[path] = LargeRestore(
                timings.total_ms,
                (peak - baseline_peak - kept_by_budget) / state,
                equal,
                timings.read_ms,
                timings.load_ms,
            )
        read_cold = sequential_read_ms(folder, state, 1) if can_drop_pages() else None
        read_warm = sequential_read_ms(folder, state, 1, cold=False)
    finally:
        close_engine(engine)
    return LargeStateFigures(
        prefix_tokens=restored,
        state_bytes=state,
        baseline_peak_bytes=baseline_peak,
        store_peak_states=(store_peak - baseline_peak) / state,
        store_equal_to_cold=cold.stats.logits_digest == reference.stats.logits_digest != "",
        store_s=store_s,
        restores=restores,
        ready_load_ms=load_ms,
        read_cold_ms=read_cold,
        read_warm_ms=read_warm,
        decode_idle_tps=decode_idle,
        decode_storing_tps=decode_storing,
        decode_during_store_share=share,
        elapsed_s=time.perf_counter() - started,
    )


def _peak_of(step: Callable[[], T]) -> tuple[T, int]:
    """What `step` gave, and the process's peak RSS during it (VmHWM, reset first where Linux lets it)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass
    done = step()
    return done, proc_status_bytes("VmHWM") or 0


def _answer(
    engine: LocalEngine,
    tokens: tuple[int, ...],
    *,
    use_cache: bool = True,
    sequence: int | None = None,
    max_tokens: int = 4,
) -> GenerationResult:
    request = GenerationRequest(tokens, SamplingParams(temperature=0.0, max_tokens=max_tokens), sequence, use_cache)
    return engine.generate(request).wait()


class _StoreWatch:
    """When the cache's writer finished the stores queued by the time `begin` was called."""

    def __init__(self, engine: LocalEngine) -> None:
        self.engine = engine
        self.began = self.ended = 0.0

    def began_after(self, answer: GenerationResult) -> GenerationResult:
        """The answer's stores were queued as it ended: they are written from now."""
        self.began = time.perf_counter()
        return answer

    def busy(self) -> bool:
        cache = self.engine.cache
        return cache is not None and cache.busy

    def end(self) -> float:
        if not self.ended:
            self.ended = time.perf_counter()
        return self.ended - self.began


def _decode_rate(engine: LocalEngine, tokens: tuple[int, ...], storing: _StoreWatch | None) -> tuple[float, float]:
    """Tokens per second of a greedy answer in the other sequence (nothing cached, nothing stored), and the
    share of its decode that ran while `storing` was busy: with `storing`, the rate of that share alone (the
    whole answer's where fewer than MIN_DURING of its tokens came during the store)."""
    handle = engine.generate(
        GenerationRequest(tokens, SamplingParams(temperature=0.0, max_tokens=DECODE_TOKENS), 1, False)
    )
    stamps: list[float] = []
    during: list[float] = []
    for event in handle.events():
        if not isinstance(event, AnswerText) or event.token_id < 0:
            continue
        stamps.append(time.perf_counter())
        if storing is not None and storing.busy():
            during.append(stamps[-1])
        elif storing is not None and not storing.ended:
            storing.end()
    handle.wait()
    if len(stamps) < 2:
        return 0.0, 0.0
    timed = during if len(during) >= MIN_DURING else stamps
    return (len(timed) - 1) / (timed[-1] - timed[0]), len(during) / len(stamps)


def _empty_for(engine: LocalEngine, tokens: tuple[int, ...], path: str) -> None:
    """Push the prefix out of both sequences and empty what `path` must not use."""
    for sequence in range(engine.info.n_sequences):
        _answer(engine, tokens[:8], use_cache=False, sequence=sequence)
    engine.flush_cache()
    cache = engine.cache
    assert cache is not None
    if path.startswith("disk"):
        engine.drop_ready_states()
        cache.ram.clear()
    if path == "disk, cold":
        drop_pages(cache.disk.directory)


def _restore(engine: LocalEngine, tokens: tuple[int, ...], path: str, state: int) -> tuple[GenerationResult, int]:
    """Answer the prefix again by `path`; with the bytes of it the RAM tier keeps where its budget is below the
    state (elsewhere 0: RAM keeps the whole state, the one copy the peak counts)."""
    cache = engine.cache
    assert cache is not None
    budget = cache.ram.budget_bytes
    kept_by_budget = 0
    below = path == "disk, RAM below"
    if below:
        cache.ram.budget_bytes = state // RAM_BELOW_SHARE
    try:
        result = _answer(engine, tokens, sequence=0)
        if below:
            engine.flush_cache()  # the answer's own blocks are kept under the lowered budget too
            kept_by_budget = cache.ram.bytes_used
    finally:
        cache.ram.budget_bytes = budget
    expected = ReuseTier.DISK if path.startswith("disk") else ReuseTier.RAM
    restore = result.stats.restore
    if result.stats.reuse_tier != expected or restore is None or restore.whole_state != (path == RESTORE_PATHS[0]):
        raise RuntimeError(f"figure W: the {path} restore took another path ({result.stats.reuse_tier}, {restore})")
    if below and not 0 < kept_by_budget < state:
        raise RuntimeError(f"figure W: RAM kept {kept_by_budget:,} bytes of a {state:,}-byte state below its budget")
    return result, kept_by_budget


def large_state_figure_verdicts(figures: LargeStateFigures | None) -> list[Verdict]:
    if figures is None:
        return []
    warm = figures.restores.get("disk, warm")
    cold = figures.restores.get("disk, cold")
    return large_state_verdicts(
        peaks=[figures.store_peak_states, *(restore.peak_states for restore in figures.restores.values())],
        cold=cold.ms / figures.read_cold_ms if cold is not None and figures.read_cold_ms else None,
        warm=warm.ms / (figures.ready_load_ms + (figures.read_warm_ms or 0.0)) if warm is not None else None,
        decode=figures.decode_storing_tps / figures.decode_idle_tps if figures.decode_idle_tps else 0.0,
        equal=figures.store_equal_to_cold and all(restore.equal_to_cold for restore in figures.restores.values()),
    )


def large_state_record(figures: LargeStateFigures) -> dict[str, Any]:
    return asdict(figures)


def large_state_table(figures: LargeStateFigures) -> str:
    lines = [
        f"W  one {figures.prefix_tokens:,}-token prefix, a {figures.state_bytes / 2**20:,.0f} MiB state "
        f"({figures.elapsed_s:.0f} s); peak RSS over the prompt's with no cache "
        f"({figures.baseline_peak_bytes / 2**20:,.0f} MiB; RAM below: less the blocks it keeps)",
        f"     storing run: peak +{figures.store_peak_states:.2f} states; "
        f"on disk {figures.store_s:.1f} s after the answer; answer as cold: "
        f"{'yes' if figures.store_equal_to_cold else 'NO'}",
        f"     {'path':18} {'ms':>8} {'read':>8} {'load':>8} {'peak':>7} {'as cold':>8}",
    ]
    for path, restore in figures.restores.items():
        lines.append(
            f"     {path:18} {restore.ms:8.1f} {restore.read_ms:8.1f} {restore.load_ms:8.1f} "
            f"{restore.peak_states:6.2f}x {'yes' if restore.equal_to_cold else 'NO':>8}"
        )
    lines.append(f"     llama.cpp's own load of the state from memory: {figures.ready_load_ms:.1f} ms")
    if figures.read_cold_ms is not None:
        lines.append(
            f"     the same bytes read from one file: cold {figures.read_cold_ms:.1f} ms, "
            f"warm {figures.read_warm_ms or 0.0:.1f} ms"
        )
    lines.append(
        f"     decode of another conversation: {figures.decode_storing_tps:.2f} tok/s while storing "
        f"({figures.decode_during_store_share:.0%} of it during the store), {figures.decode_idle_tps:.2f} idle"
    )
    return "\n".join(lines)
