"""Figure R: what one cache hit and one total miss cost, step by step, on this machine.

A prefix of the A persona's length is stored through chatapp's engine, then restored again
and again into a sequence that no longer holds it: from a whole state kept ready (RAM), from
RAM blocks assembled into a state, and from disk blocks, with the page cache warm and with the
cache folder's pages dropped first (posix_fadvise), beside the time this disk takes to read as
many bytes from one file, cold, in large sequential reads. Each restore
reports its steps (lookup, read, assembly, llama.cpp's load; kv_placement.py). The yardstick
is llama.cpp loading the same prefix from a ready buffer: the load step of the block
restores, which loads exactly the assembled state of that prefix. Then novel prompts of the
same length are answered with and without the cache, in turns, each until the engine is idle
again (with the cache: its lookup, and storing the new blocks), for what a total miss costs.
The restore paths again in each quantized KV type the model takes (kv_types.py), beside f16:
smaller states, each against llama.cpp's own load of that type.

Beside the goals, the least a block restore can cost through llama.cpp's state API, measured in
the same run: llama.cpp loads a sequence from one buffer holding the whole state, and only once
that buffer is whole, so a restore from blocks (RAM, or disk through the page cache) pays at
least one copy of the state's bytes before the load, and one from a cold disk at least the read
before the load. Those floors say how far any layout of the blocks could bring the ratios.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from cache.state_assembly import in_parallel
from chatapp.benchmark.goals import Verdict, restore_verdicts
from chatapp.benchmark.peers import PeerSettings, close_engine, open_chatapp_engine
from chatapp.benchmark.workloads import PromptKit
from chatapp.engine.contract import GenerationRequest, GenerationResult, LocalEngine, RestoreTimings, SamplingParams
from chatapp.engine.opening import KvType
from chatapp.errors import ModelError
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import ReuseTier, Role

RESTORE_NAME = "R"
PATHS = ("ram, whole state", "ram, blocks", "disk, blocks", "disk, cold")
COLD = PATHS[3]
READ_CHUNK = 1 << 20  # the sequential yardstick's reads
MIN_PREFIX_TOKENS = 160
COPY_PARTS = 32  # the floor's copy in as many parts as a model has layers, more or less


@dataclass(frozen=True)
class RestoreSteps:
    """Median milliseconds of each step of one restore path."""

    lookup_ms: float
    read_ms: float
    load_ms: float
    total_ms: float


@dataclass(frozen=True)
class RestoreFigures:
    prefix_tokens: int
    repeats: int
    paths: dict[str, RestoreSteps]
    miss_ms: float  # a novel prompt with the cache, until the engine is idle (median)
    no_cache_ms: float  # the same without the cache
    elapsed_s: float
    by_kv_type: dict[str, dict[str, RestoreSteps]] = field(default_factory=dict)  # quantized type -> paths
    # By type: the KV bytes of a token, and of the prefix a block restore put back (flash attention,
    # which a quantized type brings, computes 64 prompt tokens again where f16 computes 2).
    bytes_per_token: dict[str, int] = field(default_factory=dict)
    state_bytes: dict[str, int] = field(default_factory=dict)
    sequential_read_ms: float | None = None  # f16's restored bytes read cold from one file (None: cannot drop pages)
    copy_ms: float | None = None  # f16's restored bytes copied once within memory already touched (the least assembly)

    @property
    def ready_load_ms(self) -> float:
        """llama.cpp loading this prefix from a ready buffer (the block restores' load step)."""
        return ready_load(self.paths)

    @property
    def blocks_floor(self) -> float | None:
        """The least a restore from blocks in RAM or in the page cache can cost, as a share of llama.cpp's own
        load: one copy of the bytes into the buffer it loads from, then the load."""
        return (self.copy_ms + self.ready_load_ms) / self.ready_load_ms if self.copy_ms else None

    @property
    def cold_floor(self) -> float | None:
        """The least a restore from a cold disk can cost, as a share of reading its bytes sequentially: that
        read, straight into the buffer llama.cpp loads from, then the load."""
        if not self.sequential_read_ms:
            return None
        return (self.sequential_read_ms + self.ready_load_ms) / self.sequential_read_ms


def ready_load(paths: dict[str, RestoreSteps]) -> float:
    return min(steps.load_ms for path, steps in paths.items() if path != PATHS[0])


def measure_restores(
    settings: PeerSettings,
    kit: PromptKit,
    folder: Path,
    *,
    prefix_tokens: int,
    repeats: int,
    miss_repeats: int,
    kv_types: tuple[KvType, ...] = (KvType.Q8_0, KvType.Q4_0),
) -> RestoreFigures:
    """Store one prefix, restore it `repeats` times by each path, then time misses against no cache; then
    the restores again in each of `kv_types` the model takes."""
    started = time.perf_counter()
    # A kept whole state is loaded only when it holds at most 1.5x the tokens reused (ready_states.py): the
    # prefix must outweigh the question and the answer that the state also holds (at --quick's 40 it did not).
    prefix_tokens = max(prefix_tokens, MIN_PREFIX_TOKENS)
    persona = kit.texts.persona(7, prefix_tokens)

    def prompt(question: int, system: str = persona) -> tuple[int, ...]:
        return kit.build(
            [ChatMessage.of(Role.SYSTEM, system), ChatMessage.of(Role.USER, kit.texts.question(question, 12))]
        )

    engine = open_chatapp_engine(settings, folder)
    try:
        paths, restored, per_token = _restore_paths(engine, prompt, repeats)
        size = restored * per_token  # 0 for a recurrent model (its checkpoints are not blocks): no yardstick
        sequential = sequential_read_ms(folder, size, repeats) if can_drop_pages() and size else None
        copy = plain_copy_ms(size, repeats) if size else None
        misses: list[float] = []
        without: list[float] = []
        for repeat in range(miss_repeats):  # in turns: the machine's load drifts
            without.append(_until_idle(engine, prompt(1, kit.texts.persona(500 + repeat, prefix_tokens)), False))
            misses.append(_until_idle(engine, prompt(1, kit.texts.persona(600 + repeat, prefix_tokens)), True))
    finally:
        close_engine(engine)
    by_kv_type: dict[str, dict[str, RestoreSteps]] = {}
    sizes, per_tokens = {KvType.F16.value: restored * per_token}, {KvType.F16.value: per_token}
    for kv_type in kv_types:
        try:
            typed = open_chatapp_engine(replace(settings, kv_type=kv_type), folder / kv_type.value)
        except ModelError:  # heads whose size is not a multiple of the type's block (S names it)
            continue
        try:
            by_kv_type[kv_type.value], restored, per_token = _restore_paths(typed, prompt, repeats)
            sizes[kv_type.value], per_tokens[kv_type.value] = restored * per_token, per_token
        finally:
            close_engine(typed)
    return RestoreFigures(
        prefix_tokens=prefix_tokens,
        repeats=repeats,
        paths=paths,
        miss_ms=statistics.median(misses),
        no_cache_ms=statistics.median(without),
        elapsed_s=time.perf_counter() - started,
        by_kv_type=by_kv_type,
        bytes_per_token=per_tokens,
        state_bytes=sizes,
        sequential_read_ms=sequential,
        copy_ms=copy,
    )


def _restore_paths(
    engine: LocalEngine, prompt: Callable[[int], tuple[int, ...]], repeats: int
) -> tuple[dict[str, RestoreSteps], int, int]:
    """Store the persona's prefix, then restore it `repeats` times by each path: each path's median
    steps, the tokens a block restore put back, and the KV bytes of a token."""
    _answer(engine, prompt(0))
    engine.flush_cache()
    timings: dict[str, list[RestoreTimings]] = {path: [] for path in PATHS}
    reused = 0
    for number, path in enumerate(PATHS):  # path by path: only the disk paths empty the RAM tier
        if path == COLD and not can_drop_pages():
            continue
        for repeat in range(repeats):
            restore, reused = _restore(engine, prompt(100 + number * repeats + repeat), path)
            timings[path].append(restore)
    assert engine.cache is not None
    steps = {path: _median_steps(found) for path, found in timings.items() if found}
    return steps, reused, engine.cache.layout.bytes_per_cell


def _answer(
    engine: LocalEngine, tokens: tuple[int, ...], *, use_cache: bool = True, sequence: int | None = None
) -> GenerationResult:
    request = GenerationRequest(tokens, SamplingParams(temperature=0.0, max_tokens=4), sequence, use_cache)
    return engine.generate(request).wait()


def _restore(engine: LocalEngine, tokens: tuple[int, ...], path: str) -> tuple[RestoreTimings, int]:
    """Push the prefix out of every sequence, empty the tiers `path` must not use, and restore it: its
    timings, and the tokens it reused."""
    for sequence in range(engine.info.n_sequences):
        _answer(engine, tokens[:8], use_cache=False, sequence=sequence)
    engine.flush_cache()
    cache = engine.cache
    assert cache is not None
    if path != "ram, whole state":
        engine.drop_ready_states()  # the engine is idle here
    if path.startswith("disk"):
        cache.ram.clear()
    if path == COLD:
        drop_pages(cache.disk.directory)
    result = _answer(engine, tokens)
    expected = ReuseTier.DISK if path.startswith("disk") else ReuseTier.RAM
    restore = result.stats.restore
    if result.stats.reuse_tier != expected or restore is None or restore.whole_state != (path == PATHS[0]):
        raise RuntimeError(f"figure R: the {path} restore took another path ({result.stats.reuse_tier}, {restore})")
    return restore, result.stats.reused_tokens


def can_drop_pages() -> bool:
    return hasattr(os, "posix_fadvise")


def drop_pages(folder: Path) -> None:
    """Take every file under `folder` out of the page cache (written back first: dirty pages stay). A file
    or folder the cache removes meanwhile (a cull, a superseded block) is passed over."""
    for parent, _folders, files in os.walk(folder):  # a folder gone meanwhile is skipped
        for name in files:
            try:
                descriptor = os.open(os.path.join(parent, name), os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(descriptor)
                os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(descriptor)


def sequential_read_ms(folder: Path, size: int, repeats: int, *, cold: bool = True) -> float:
    """Median time to read `size` bytes from one file in this folder in large sequential reads, cold (what
    the disk itself costs, the yardstick of a cold restore) or from the page cache."""
    path = folder / "sequential.bin"
    chunk = np.random.default_rng(3).integers(0, 256, READ_CHUNK, dtype=np.uint8).tobytes()
    with path.open("wb") as out:
        for _ in range(0, size, READ_CHUNK):
            out.write(chunk)
    buffer = bytearray(READ_CHUNK)

    def read() -> float:
        started = time.perf_counter()
        with path.open("rb", buffering=0) as source:
            while source.readinto(buffer):
                pass
        return (time.perf_counter() - started) * 1000

    times = []
    try:
        if not cold:
            read()  # all of it in the page cache
        for _ in range(repeats):
            if cold:
                drop_pages(folder)
            times.append(read())
    finally:
        path.unlink(missing_ok=True)
    return statistics.median(times)


def plain_copy_ms(size: int, repeats: int) -> float:
    """Median time of one copy of `size` bytes from memory already touched into memory already touched, spread
    over the cores as a restore's assembly spreads its copies (state_assembly.in_parallel): the least an assembly
    of blocks into one buffer costs (a restore reuses its buffer, state_assembly.StateBuffer)."""
    source = np.ones(size, dtype=np.uint8)
    target = np.full(size, 2, dtype=np.uint8)  # written: np.zeros' pages would fault in the first copy
    bounds = [size * part // COPY_PARTS for part in range(COPY_PARTS + 1)]

    def copy(parts: slice) -> None:
        start, end = bounds[parts.start], bounds[parts.stop]
        np.copyto(target[start:end], source[start:end])

    times = []
    for _ in range(max(repeats, 3)):
        started = time.perf_counter()
        in_parallel(copy, COPY_PARTS, size)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _until_idle(engine: LocalEngine, tokens: tuple[int, ...], use_cache: bool) -> float:
    started = time.perf_counter()
    _answer(engine, tokens, use_cache=use_cache)
    engine.flush_cache()  # the answer's recompute, and with the cache its lookup and stores
    return (time.perf_counter() - started) * 1000


def _median_steps(timings: list[RestoreTimings]) -> RestoreSteps:
    names = [field.name for field in fields(RestoreSteps) if field.name != "total_ms"]
    medians = {name: statistics.median([getattr(timing, name) for timing in timings]) for name in names}
    return RestoreSteps(**medians, total_ms=statistics.median([timing.total_ms for timing in timings]))


def restore_figure_verdicts(figures: RestoreFigures | None) -> list[Verdict]:
    if figures is None:
        return []
    load = figures.ready_load_ms
    cold = figures.paths.get(COLD)
    return restore_verdicts(
        ram=figures.paths["ram, whole state"].total_ms / load,
        ram_blocks=figures.paths["ram, blocks"].total_ms / load,
        disk=figures.paths["disk, blocks"].total_ms / load,
        disk_cold=cold.total_ms / figures.sequential_read_ms if cold and figures.sequential_read_ms else None,
        miss=figures.miss_ms / figures.no_cache_ms,
    )


def restore_record(figures: RestoreFigures) -> dict[str, Any]:
    """For bench.json."""
    return {
        **asdict(figures),
        "ready_load_ms": figures.ready_load_ms,
        "blocks_floor": figures.blocks_floor,
        "cold_floor": figures.cold_floor,
    }


def restore_table(figures: RestoreFigures) -> str:
    """A few lines for the terminal: each path's steps, and a miss beside no cache."""
    lines = [
        f"R  restoring a {figures.prefix_tokens:,}-token prefix (median of {figures.repeats}, ms; "
        f"llama.cpp loading it from a ready buffer: {figures.ready_load_ms:.1f} ms; {figures.elapsed_s:.0f} s)",
        f"     {'path':18} {'lookup':>7} {'read':>7} {'load':>7} {'total':>7} {'/ ready':>8}",
    ]
    lines += _path_lines(figures.paths)
    cold = figures.paths.get(COLD)
    if cold is not None and figures.sequential_read_ms:
        lines.append(
            f"     the same bytes read cold from one file: {figures.sequential_read_ms:.1f} ms (the cold restore "
            f"{cold.total_ms / figures.sequential_read_ms:.2f}x)"
        )
    lines += _floor_lines(figures)
    lines.append(
        f"     a total miss until idle: {figures.miss_ms:,.0f} ms with the cache, {figures.no_cache_ms:,.0f} ms "
        f"without ({figures.miss_ms / figures.no_cache_ms:.3f}x)"
    )
    f16_per_token = figures.bytes_per_token.get(KvType.F16.value, 0)
    for kv_type, paths in figures.by_kv_type.items():
        size, per_token = figures.state_bytes.get(kv_type, 0), figures.bytes_per_token.get(kv_type, 0)
        lines.append(
            f"   in {kv_type} KV cells: {size / (1 << 20):.1f} MiB ({per_token / max(f16_per_token, 1):.3f}x f16's "
            f"bytes per token), "
            f"llama.cpp's own load {ready_load(paths):.1f} ms"
        )
        lines += _path_lines(paths)
    return "\n".join(lines)


def _floor_lines(figures: RestoreFigures) -> list[str]:
    """The floors through llama.cpp's state API (see the module docstring), where this run measured them."""
    lines = []
    if figures.blocks_floor is not None and figures.copy_ms is not None:
        lines.append(
            f"     the least through llama.cpp's one-buffer load: from blocks (RAM, page cache) a copy "
            f"({figures.copy_ms:.1f} ms) then the load, {figures.blocks_floor:.2f}x the load"
        )
    if figures.cold_floor is not None:
        lines.append(f"     from a cold disk the one-file read then the load, {figures.cold_floor:.2f}x the read")
    return lines


def _path_lines(paths: dict[str, RestoreSteps]) -> list[str]:
    load = ready_load(paths)
    return [
        f"     {path:18} {steps.lookup_ms:7.1f} {steps.read_ms:7.1f} "
        f"{steps.load_ms:7.1f} {steps.total_ms:7.1f} {steps.total_ms / load:7.2f}x"
        for path, steps in paths.items()
    ]
