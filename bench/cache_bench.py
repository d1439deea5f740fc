"""Side-by-side benchmark of chatapp's prefix KV cache against llama-cpp-python's caches.

Run from the repository root:

    .venv/bin/python bench/cache_bench.py            # full run (2,000-token personas), ~10 min on 2 cores
    .venv/bin/python bench/cache_bench.py --quick    # ~500-token personas, a smoke run of about a minute
    .venv/bin/python bench/cache_bench.py --json out.json

Everything runs in ONE process on the bundled model, with the same threads and per-sequence
context for every variant (except the disk-tier variant, which by definition is a fresh process:
a child of this script on the same cache folder). Variants are interleaved: each repetition
rotates their order so that machine noise lands on all of them alike; the medians are reported.

Sections (see issue 3, "Performance"):
  A  scenario A of the article: persona P1 + question, persona P2 + question, back to P1 with a
     new question; TTFT of the way-back request per variant, as a ratio to the ideal (the same
     request with P1's prefix live and nothing in between).
  B  cold prefill speed on a 2,000-token prompt: chatapp's engine vs llama-cpp-python defaults.
  C  lookup cost in an index holding 10,000 conversations.
  D  storage of 50 conversations sharing a persona, through the real engine.
  E  no-hit overhead: cache on vs off, interleaved.

This script only reads the project's code; the few runtime wrappers it installs (timers around
engine methods, to break TTFT down into phases) live in this process only.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import llama_cpp  # noqa: E402
import numpy as np  # noqa: E402

import chatapp.engine.kv_placement as kv_placement  # noqa: E402
from cache.blocks import BlockInfo  # noqa: E402
from cache.fingerprint import hash_file  # noqa: E402
from cache.index import BlockIndex  # noqa: E402
from cache.keys import as_token_array  # noqa: E402
from cache.prefix_cache import CacheConfig  # noqa: E402
from chatapp.engine.engine import Engine, EngineConfig, GenerationRequest  # noqa: E402
from chatapp.engine.llama_native import SamplingParams  # noqa: E402
from chatapp.engine.prompt import SYSTEM, USER, ChatMessage  # noqa: E402
from chatapp.model_files import bundled_model_path  # noqa: E402
from chatapp.services.startup import kv_cache_factory  # noqa: E402

GREEDY_ONE = SamplingParams(temperature=0.0, max_tokens=1)
BLOCK_SIZE = 64
MIB = 1 << 20

# Deterministic, varied, realistic prompt text: the same generator as `chatapp bench`.
from chatapp.benchmark.workloads import TextMaker  # noqa: E402


# --------------------------------------------------------------------------------------------
# How much CPU other processes took while a sample ran (the machine is shared).

_TICK = os.sysconf("SC_CLK_TCK")


def _busy_seconds() -> float:
    with open("/proc/stat") as handle:
        fields = [int(value) for value in handle.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / _TICK


def _own_seconds() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


class CpuWatch:
    """Cores' worth of CPU used by other processes between start and stop."""

    def __init__(self) -> None:
        self.wall, self.busy, self.own = time.perf_counter(), _busy_seconds(), _own_seconds()

    def others(self) -> float:
        wall = time.perf_counter() - self.wall
        other = (_busy_seconds() - self.busy) - (_own_seconds() - self.own)
        return round(max(other, 0.0) / wall, 3) if wall > 0 else 0.0


# --------------------------------------------------------------------------------------------
# chatapp engines, with timers around their phases.


class Phases:
    """Accumulates milliseconds per named phase for the request in flight (one at a time)."""

    def __init__(self) -> None:
        self.current: dict[str, float] = {}

    def reset(self) -> None:
        self.current = {}

    def add(self, name: str, ms: float) -> None:
        self.current[name] = self.current.get(name, 0.0) + ms

    def wrap(self, name: str, function):  # type: ignore[no-untyped-def]
        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.add(name, (time.perf_counter() - started) * 1000)

        return timed


PHASES = Phases()
_MODULE_WRAPPED = False


def _wrap_module_functions() -> None:
    global _MODULE_WRAPPED
    if not _MODULE_WRAPPED:
        kv_placement.assemble_state = PHASES.wrap("assemble", kv_placement.assemble_state)
        kv_placement.write_sequence_state = PHASES.wrap("set_state", kv_placement.write_sequence_state)
        _MODULE_WRAPPED = True


class Bench:
    """An engine, the count of requests it has fully served (save included), and phase timers."""

    def __init__(self, name: str, engine: Engine) -> None:
        self.name = name
        self.engine = engine
        self._served = 0
        self._condition = threading.Condition()
        self.last_post_ms = 0.0
        original_serve = engine._serve

        def serve(handle):  # type: ignore[no-untyped-def]
            original_serve(handle)
            ended = time.perf_counter()
            result = handle._result
            if result is not None:
                self.last_post_ms = (ended - handle.submitted_at) * 1000 - result.stats.total_ms
            with self._condition:
                self._served += 1
                self._condition.notify_all()

        engine._serve = serve  # looked up per job by the engine thread
        _wrap_module_functions()
        engine.placer.place = PHASES.wrap("place", engine.placer.place)
        engine.context.decode = PHASES.wrap("decode", engine.context.decode)
        if engine.cache is not None:
            engine.cache.lookup = PHASES.wrap("lookup", engine.cache.lookup)
            engine.cache.fetch = PHASES.wrap("fetch", engine.cache.fetch)

    def ask(self, tokens: list[int], *, use_cache: bool = True) -> dict[str, object]:
        """One request, waited for until the engine is idle and the cache writer has drained."""
        with self._condition:
            before = self._served
        PHASES.reset()
        watch = CpuWatch()
        result = self.engine.generate(GenerationRequest(tuple(tokens), GREEDY_ONE, use_cache=use_cache)).wait()
        others = watch.others()
        phases = dict(PHASES.current)
        with self._condition:
            self._condition.wait_for(lambda: self._served > before)
        flush_started = time.perf_counter()
        if self.engine.cache is not None:
            self.engine.cache.flush()
        flush_ms = (time.perf_counter() - flush_started) * 1000
        stats = result.stats
        return {
            "ttft_ms": stats.ttft_ms,
            "prefill_ms": stats.prefill_ms,
            "prompt_tokens": stats.prompt_tokens,
            "reused_tokens": stats.reused_tokens,
            "computed_tokens": stats.computed_tokens,
            "tier": stats.reuse_tier,
            "post_answer_engine_ms": self.last_post_ms,
            "background_flush_ms": flush_ms,
            "phases_ms": {key: round(value, 3) for key, value in phases.items()},
            "other_processes_cores": others,
        }

    def close(self) -> None:
        self.engine.close()


def make_engine(model_path: Path, *, folder: Path | None, sequences: int, context: int, threads: int, fingerprint: str | None) -> Engine:
    factory = None
    if folder is not None:
        config = CacheConfig(block_size=BLOCK_SIZE, ram_budget_bytes=2 << 30, disk_budget_bytes=10 << 30, ttl_seconds=7 * 86400)
        factory = kv_cache_factory(folder, fingerprint or hash_file(model_path), config)
    return Engine(EngineConfig(model_path=model_path, context_cap=context, sequences=sequences, threads=threads), factory)


# --------------------------------------------------------------------------------------------
# llama-cpp-python's Llama, with the same threads and context.


class TimedLookup:
    """Mixed into llama-cpp-python's caches: times each lookup as the `cache_lookup` phase."""

    def __getitem__(self, key):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            return super().__getitem__(key)  # type: ignore[misc]
        finally:
            PHASES.add("cache_lookup", (time.perf_counter() - started) * 1000)


class TimedRAMCache(TimedLookup, llama_cpp.LlamaRAMCache):
    pass


class TimedDiskCache(TimedLookup, llama_cpp.LlamaDiskCache):
    pass


def make_llama(model_path: Path, *, context: int, threads: int, **options: object) -> llama_cpp.Llama:
    llm = llama_cpp.Llama(
        model_path=str(model_path), n_ctx=context, n_threads=threads, n_threads_batch=threads, verbose=False, **options
    )
    llm.load_state = PHASES.wrap("load_state", llm.load_state)
    llm.eval = PHASES.wrap("eval", llm.eval)
    return llm


def llama_ask(llm: llama_cpp.Llama, tokens: list[int]) -> dict[str, object]:
    """TTFT: until create_completion's stream yields its first chunk (before the cache save)."""
    PHASES.reset()
    sink = io.StringIO()
    with contextlib.redirect_stderr(sink):  # LlamaDiskCache prints on every save
        watch = CpuWatch()
        started = time.perf_counter()
        stream = llm.create_completion(list(tokens), max_tokens=1, temperature=0.0, stream=True)
        next(stream)
        ttft_ms = (time.perf_counter() - started) * 1000
        others = watch.others()
        phases = dict(PHASES.current)
        save_started = time.perf_counter()
        for _ in stream:
            pass
        save_ms = (time.perf_counter() - save_started) * 1000
    return {
        "ttft_ms": ttft_ms,
        "prompt_tokens": len(tokens),
        "after_first_token_ms (cache save)": save_ms,
        "phases_ms": {key: round(value, 3) for key, value in phases.items()},
        "other_processes_cores": others,
    }


# --------------------------------------------------------------------------------------------
# The disk tier in a new process.


def child_disk(args: argparse.Namespace) -> None:
    """Child mode: open an engine on the cache folder, ask once, print the stats as JSON."""
    started = time.perf_counter()
    payload = json.loads(Path(args.child_tokens).read_text())
    tokens, second = payload["timed"], payload.get("second")
    model_path = bundled_model_path()
    engine = make_engine(
        model_path, folder=Path(args.child_disk), sequences=args.child_sequences, context=args.context, threads=args.threads,
        fingerprint=args.child_fingerprint,
    )
    bench = Bench("child", engine)
    ready_ms = (time.perf_counter() - started) * 1000
    result = bench.ask(tokens)
    result["process_ready_ms"] = ready_ms
    result["index_entries"] = len(engine.cache.index) if engine.cache is not None else 0
    if second:
        # Diagnostic, not part of the TTFT: the same kind of request once the process is warm.
        result["second_request_same_process"] = bench.ask(second)
    bench.close()
    print("CHILD-RESULT " + json.dumps(result), flush=True)


def drop_page_cache(folder: Path) -> int:
    """Ask the kernel to drop the cache folder's pages (fsync first so that they are clean)."""
    dropped = 0
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                dropped += path.stat().st_size
            finally:
                os.close(fd)
    return dropped


def run_child(
    folder: Path, tokens: list[int], work: Path, args: argparse.Namespace, fingerprint: str, *, drop: bool, second: list[int] | None = None
) -> dict:
    token_file = work / "child_tokens.json"
    token_file.write_text(json.dumps({"timed": tokens, "second": second}))
    if drop:
        drop_page_cache(folder)
    command = [
        sys.executable, str(Path(__file__).resolve()), "--child-disk", str(folder), "--child-tokens", str(token_file),
        "--child-sequences", "2", "--child-fingerprint", fingerprint, "--threads", str(args.threads), "--context", str(args.context),
    ]
    started = time.perf_counter()
    watch = CpuWatch()
    done = subprocess.run(command, capture_output=True, text=True, cwd=str(REPO), timeout=600)
    whole_run_others = watch.others()
    wall_ms = (time.perf_counter() - started) * 1000
    for line in done.stdout.splitlines():
        if line.startswith("CHILD-RESULT "):
            result = json.loads(line[len("CHILD-RESULT ") :])
            result["child_wall_ms"] = wall_ms
            result["other_processes_cores_whole_child"] = whole_run_others
            return result
    raise RuntimeError(f"child failed (rc {done.returncode}): {done.stderr[-2000:]}")


# --------------------------------------------------------------------------------------------
# Helpers.


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def folder_bytes(folder: Path) -> tuple[int, int]:
    """(apparent bytes, allocated bytes) of every file under `folder`."""
    apparent = allocated = 0
    for path in folder.rglob("*"):
        if path.is_file():
            stat = path.stat()
            apparent += stat.st_size
            allocated += stat.st_blocks * 512
    return apparent, allocated


def unique_prefix_tokens(prompts: list[list[int]]) -> int:
    """Distinct (prefix) positions over all prompts: the size of their token trie."""
    total = 0
    arrays = [np.asarray(prompt, dtype=np.int64) for prompt in prompts]
    for index, array in enumerate(arrays):
        best = 0
        for earlier in arrays[:index]:
            limit = min(earlier.size, array.size)
            differ = np.flatnonzero(earlier[:limit] != array[:limit])
            best = max(best, int(differ[0]) if differ.size else limit)
        total += array.size - best
    return total


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Sizes:
    persona: int
    question: int
    reps: int
    prefill_tokens: int
    prefill_reps: int
    conversations: int
    lookup_conversations: int
    nohit_reps: int
    nohit_persona: int
    drop_page_cache: bool
    extras: dict = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Section A: scenario A.


def section_a(args, sizes: Sizes, model_path: Path, fingerprint: str, work: Path, texts: TextMaker, engines: dict) -> dict:
    ideal = engines["ideal"]
    build = ideal.engine.prompt_builder.build

    def prompt(persona: str, question: str) -> list[int]:
        return build([ChatMessage.of(SYSTEM, persona), ChatMessage.of(USER, question)])

    p1, p2 = texts.persona(1, sizes.persona), texts.persona(2, sizes.persona)
    q = lambda seed: texts.question(seed, sizes.question)  # noqa: E731
    first_p1, first_p2 = prompt(p1, q(1)), prompt(p2, q(2))
    log(f"A: P1 prompt {len(first_p1)} tokens, P2 prompt {len(first_p2)} tokens")

    # Warm-up: P1 and P2 computed once in the RAM engine, whose folder is then copied for the others.
    ram_folder, dev_folder, disk_folder, disk2_folder = (work / name for name in ("kv-ram", "kv-dev", "kv-disk", "kv-disk-dropped"))
    seed_engine = Bench("seed", make_engine(model_path, folder=ram_folder, sequences=1, context=args.context, threads=args.threads, fingerprint=fingerprint))
    setup = {"p1_cold": seed_engine.ask(first_p1), "p2_cold": seed_engine.ask(first_p2)}
    seed_engine.close()
    for target in (dev_folder, disk_folder, disk2_folder):
        shutil.copytree(ram_folder, target)
    log(f"A: P1 cold {setup['p1_cold']['ttft_ms']:.0f} ms, P2 cold {setup['p2_cold']['ttft_ms']:.0f} ms (seeded the cache folders)")

    dev = Bench("device", make_engine(model_path, folder=dev_folder, sequences=2, context=args.context, threads=args.threads, fingerprint=fingerprint))
    ram = Bench("ram", make_engine(model_path, folder=ram_folder, sequences=1, context=args.context, threads=args.threads, fingerprint=fingerprint))
    engines["device"] = dev
    cold = engines["cold"]
    llm: llama_cpp.Llama = engines["llama"]
    llama_ram_cache = TimedRAMCache()
    llama_disk_cache = TimedDiskCache(str(work / "llama-disk"), capacity_bytes=10 << 30)

    # Warm-up of the resident engines (not timed): P1 and P2 land in their sequences / caches.
    dev.ask(first_p1), dev.ask(first_p2)
    ram.ask(first_p1), ram.ask(first_p2)
    ideal.ask(first_p1)
    llm.set_cache(llama_ram_cache)
    llama_ask(llm, first_p1), llama_ask(llm, first_p2)
    for key, value in llama_ram_cache.cache_state.items():  # the same states, as if computed with the disk cache
        with contextlib.redirect_stderr(io.StringIO()):
            llama_disk_cache[key] = value

    def way_back(bench: Bench, r: int) -> dict:
        bench.ask(prompt(p1, q(100 + r)))
        bench.ask(prompt(p2, q(200 + r)))
        return bench.ask(prompt(p1, q(300 + r)))

    def device(r: int) -> dict:
        return way_back(dev, r)

    def ram_tier(r: int) -> dict:
        return way_back(ram, r)

    def ideal_run(r: int) -> dict:
        ideal.ask(prompt(p1, q(100 + r)))  # P1 live, then the same way-back request right after
        return ideal.ask(prompt(p1, q(300 + r)))

    def cold_run(r: int) -> dict:
        return cold.ask(prompt(p1, q(300 + r)), use_cache=False)

    def disk(r: int) -> dict:
        return run_child(disk_folder, prompt(p1, q(300 + r)), work, args, fingerprint, drop=False, second=prompt(p1, q(400 + r)))

    def disk_dropped(r: int) -> dict:
        return run_child(disk2_folder, prompt(p1, q(300 + r)), work, args, fingerprint, drop=True)

    def llama_way_back(cache, r: int) -> dict:  # type: ignore[no-untyped-def]
        llm.set_cache(cache)
        llama_ask(llm, prompt(p1, q(100 + r)))
        llama_ask(llm, prompt(p2, q(200 + r)))
        return llama_ask(llm, prompt(p1, q(300 + r)))

    def llama_ram(r: int) -> dict:
        return llama_way_back(llama_ram_cache, r)

    def llama_disk(r: int) -> dict:
        return llama_way_back(llama_disk_cache, r)

    def llama_ideal(r: int) -> dict:
        llm.set_cache(None)
        llama_ask(llm, prompt(p1, q(100 + r)))
        return llama_ask(llm, prompt(p1, q(300 + r)))

    variants = {
        "a chatapp device": device,
        "b chatapp ram": ram_tier,
        "c chatapp disk (new process)": disk,
        "d ideal (prefix live, chatapp engine)": ideal_run,
        "e cold (use_cache=False)": cold_run,
        "f llama LlamaRAMCache": llama_ram,
        "g llama LlamaDiskCache": llama_disk,
        "h llama ideal (Llama prefix reuse)": llama_ideal,
    }
    if sizes.drop_page_cache:
        variants["c2 chatapp disk, page cache dropped"] = disk_dropped
    samples: dict[str, list[dict]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(sizes.reps):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            result = variants[name](r)
            samples[name].append(result)
            log(f"A rep {r}: {name}: ttft {result['ttft_ms']:.1f} ms tier={result.get('tier', '-')} reused={result.get('reused_tokens', '-')}")
    ram.close()
    llama_disk_cache.cache.close()
    return {"setup": setup, "samples": samples, "way_back_prompt_tokens": len(prompt(p1, q(300)))}


# --------------------------------------------------------------------------------------------
# Section B: prefill.


def section_b(args, sizes: Sizes, model_path: Path, texts: TextMaker, engines: dict) -> dict:
    cold: Bench = engines["cold"]
    build = cold.engine.prompt_builder.build
    tokens = build([ChatMessage.of(SYSTEM, texts.persona(3, sizes.prefill_tokens + 200)), ChatMessage.of(USER, "Hello.")])[: sizes.prefill_tokens]
    llm_default: llama_cpp.Llama = engines["llama"]
    server_like = make_llama(model_path, context=args.context, threads=args.threads, n_batch=2048, n_ubatch=512, flash_attn=True)

    def llama_prefill(llm: llama_cpp.Llama) -> float:
        llm.reset()
        started = time.perf_counter()
        llm.eval(tokens)
        return (time.perf_counter() - started) * 1000

    variants = {
        "chatapp engine (n_batch=n_ubatch=512, flash off)": lambda: cold.ask(tokens, use_cache=False)["prefill_ms"],
        "llama-cpp-python Llama defaults (n_batch=n_ubatch=512, flash off)": lambda: llama_prefill(llm_default),
        "Llama server-like (n_batch=2048, n_ubatch=512, flash on)": lambda: llama_prefill(server_like),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(sizes.prefill_reps):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            ms = variants[name]()
            samples[name].append(ms)
            log(f"B rep {r}: {name}: {len(tokens) / ms * 1000:.1f} tok/s")
    return {"tokens": len(tokens), "samples_ms": samples}


# --------------------------------------------------------------------------------------------
# Section C: lookup with many conversations.


def section_c(sizes: Sizes) -> dict:
    rng = np.random.default_rng(7)
    n = sizes.lookup_conversations
    persona = rng.integers(0, 49152, 2000, dtype=np.int32)
    index = BlockIndex(BLOCK_SIZE, seed=12345)
    started = time.perf_counter()
    conversations = []
    for _ in range(n):
        tokens = np.concatenate([persona, rng.integers(0, 49152, 200, dtype=np.int32)])
        conversations.append(tokens)
        for key, parent, start, end in index.keys_for(tokens):
            if key not in index:
                index.add(BlockInfo(key, parent, start, tokens[start:end].copy(), (end - start) * 23052, 0))
    build_s = time.perf_counter() - started
    log(f"C: index of {n} conversations: {len(index)} blocks, built in {build_s:.1f} s")

    def time_lookups(make_prompt, count: int = 2000) -> dict:  # type: ignore[no-untyped-def]
        prompts = [make_prompt(i) for i in range(count)]
        lists = [prompt.tolist() for prompt in prompts]
        times, matched = [], []
        for prompt in lists:
            started = time.perf_counter()
            match = index.longest_prefix(as_token_array(prompt))  # what PrefixCache.lookup does, from a list
            times.append((time.perf_counter() - started) * 1000)
            matched.append(match.matched_tokens)
        times.sort()
        return {
            "median_ms": times[len(times) // 2],
            "p99_ms": times[int(len(times) * 0.99)],
            "max_ms": times[-1],
            "median_matched_tokens": int(np.median(matched)),
        }

    results = {
        "follow-up of a stored conversation (+200 new tokens)": time_lookups(
            lambda i: np.concatenate([conversations[i * 37 % n], rng.integers(0, 49152, 200, dtype=np.int32)])
        ),
        "new conversation on the shared persona (+200 new tokens)": time_lookups(
            lambda i: np.concatenate([persona, rng.integers(0, 49152, 200, dtype=np.int32)])
        ),
        "nothing matches (2,200 random tokens)": time_lookups(lambda i: rng.integers(0, 49152, 2200, dtype=np.int32)),
    }
    # Hashing a 2,200-token prompt into block keys (what has_new_blocks does after each answer).
    started = time.perf_counter()
    for i in range(200):
        index.keys_for(conversations[i])
    results["keys_for 2,200 tokens (store-side hashing)"] = {"median_ms": (time.perf_counter() - started) * 1000 / 200}
    return {"conversations": n, "blocks": len(index), "build_s": build_s, "lookups": results}


# --------------------------------------------------------------------------------------------
# Section D: storage.


def section_d(args, sizes: Sizes, model_path: Path, fingerprint: str, work: Path, texts: TextMaker) -> dict:
    folder = work / "kv-storage"
    bench = Bench("storage", make_engine(model_path, folder=folder, sequences=2, context=args.context, threads=args.threads, fingerprint=fingerprint))
    build = bench.engine.prompt_builder.build
    persona = texts.persona(4, sizes.persona)
    prompts = [build([ChatMessage.of(SYSTEM, persona), ChatMessage.of(USER, texts.question(1000 + i, sizes.question))]) for i in range(sizes.conversations)]
    started = time.perf_counter()
    tiers: dict[str, int] = {}
    for i, tokens in enumerate(prompts):
        result = bench.ask(tokens)
        tiers[result["tier"]] = tiers.get(result["tier"], 0) + 1
        if i % 10 == 0:
            log(f"D: conversation {i}: {len(tokens)} tokens, tier {result['tier']}, reused {result['reused_tokens']}")
    elapsed = time.perf_counter() - started
    cache = bench.engine.cache
    assert cache is not None
    stats = cache.stats()
    bytes_per_token = cache.layout.bytes_per_cell
    payload = sum(info.payload_size for info in cache.index.entries.values())
    entries = len(cache.index)
    partial = sum(1 for info in cache.index.entries.values() if info.tokens.size < BLOCK_SIZE)
    bench.close()
    apparent, allocated = folder_bytes(folder)
    unique = unique_prefix_tokens(prompts)
    ideal_bytes = unique * bytes_per_token
    return {
        "conversations": len(prompts),
        "prompt_tokens_each": [min(len(p) for p in prompts), max(len(p) for p in prompts)],
        "unique_tokens": unique,
        "kv_bytes_per_token": bytes_per_token,
        "unique_kv_bytes": ideal_bytes,
        "folder_apparent_bytes": apparent,
        "folder_allocated_bytes": allocated,
        "stored_payload_bytes": payload,
        "index_entries": entries,
        "partial_blocks": partial,
        "ratio_folder_apparent": apparent / ideal_bytes,
        "ratio_folder_allocated": allocated / ideal_bytes,
        "ratio_payload": payload / ideal_bytes,
        "disk_stats": stats["disk"],
        "tiers": tiers,
        "elapsed_s": elapsed,
    }


# --------------------------------------------------------------------------------------------
# Section E: no-hit overhead.


def section_e(sizes: Sizes, texts: TextMaker, engines: dict) -> dict:
    on: Bench = engines["device"]
    off: Bench = engines["cold"]
    build = on.engine.prompt_builder.build
    variants = {
        "cache on (use_cache=True)": lambda tokens: on.ask(tokens, use_cache=True),
        "same engine, use_cache=False": lambda tokens: on.ask(tokens, use_cache=False),
        "engine without a cache (--no-cache)": lambda tokens: off.ask(tokens, use_cache=False),
    }
    samples: dict[str, list[dict]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(sizes.nohit_reps):
        persona, question = texts.persona(500 + r, sizes.nohit_persona), texts.question(500 + r, sizes.question)
        # Each variant gets the same prompt but for its first content token (a letter: one token),
        # so that no variant can reuse what another one just computed in the same engine.
        prompts = {
            name: build([ChatMessage.of(SYSTEM, f"{chr(65 + (r * len(names) + number) % 26)}) {persona}"), ChatMessage.of(USER, question)])
            for number, name in enumerate(names)
        }
        for name in names[r % len(names) :] + names[: r % len(names)]:
            tokens = prompts[name]
            result = variants[name](tokens)
            samples[name].append(result)
            log(f"E rep {r}: {name}: ttft {result['ttft_ms']:.1f} ms reused={result['reused_tokens']} post={result['post_answer_engine_ms']:.1f} ms")
    return {"prompt_tokens": len(tokens), "samples": samples}


# --------------------------------------------------------------------------------------------
# Report.


def summarize(results: dict) -> list[str]:
    lines: list[str] = []
    a = results.get("A")
    if a:
        samples = a["samples"]
        ideal_name = "d ideal (prefix live, chatapp engine)"
        ideal = median([s["ttft_ms"] for s in samples[ideal_name]])
        targets = {"a chatapp device": 1.05, "b chatapp ram": 1.05, "c chatapp disk (new process)": 1.15}
        lines.append(f"A. Scenario A, way-back TTFT ({a['way_back_prompt_tokens']} prompt tokens), median of {len(samples[ideal_name])}")
        lines.append(
            "   x ideal: median TTFT / ideal's; paired: median over reps of TTFT / the ideal's TTFT on the same question;"
        )
        lines.append(
            "   overhead: median of TTFT minus the suffix compute (chatapp decode / Llama eval); model: (ideal + overhead"
            " - ideal's overhead) / ideal, the noise-free reading"
        )
        lines.append(
            f"   {'variant':44} {'median ms':>10} {'min':>8} {'max':>8} {'x ideal':>8} {'paired':>7} {'overhead':>9} {'model':>6}"
            f"  {'target':>7} {'x/paired/model':14}  reused/tier  others(cores, max)"
        )
        summary = {}

        def overhead(run: dict) -> float:
            phases = run.get("phases_ms", {})
            return run["ttft_ms"] - phases.get("decode", phases.get("eval", 0.0))

        ideal_runs = samples[ideal_name]
        ideal_overhead = median([overhead(run) for run in ideal_runs])
        for name, runs in samples.items():
            ttfts = [s["ttft_ms"] for s in runs]
            ratio = median(ttfts) / ideal
            paired = median([run["ttft_ms"] / base["ttft_ms"] for run, base in zip(runs, ideal_runs)])
            extra = median([overhead(run) for run in runs])
            model = (ideal + extra - ideal_overhead) / ideal
            target = targets.get(name)
            verdict = "" if target is None else "/".join("ok" if value <= target else "MISS" for value in (ratio, paired, model))
            reuse = ""
            if "reused_tokens" in runs[-1]:
                reuse = f"{runs[-1]['reused_tokens']}/{runs[-1]['tier']}"
            others = max(run.get("other_processes_cores", 0.0) for run in runs)
            lines.append(
                f"   {name:44} {median(ttfts):10.1f} {min(ttfts):8.1f} {max(ttfts):8.1f} {ratio:8.3f} {paired:7.3f} {extra:9.1f} {model:6.3f}"
                f"  {('<=' + str(target)) if target else '':>7} {verdict:14} {reuse:>12}  {others:.2f}"
            )
            phases: dict[str, list[float]] = {}
            for run in runs:
                for key, value in run.get("phases_ms", {}).items():
                    phases.setdefault(key, []).append(value)
            summary[name] = {
                "median_ttft_ms": median(ttfts), "ratio_to_ideal": ratio, "paired_ratio": paired, "overhead_ms": extra,
                "model_ratio": model, "target": target,
                "phases_median_ms": {key: round(median(v), 2) for key, v in phases.items()},
            }
        a["summary"] = summary
        disk_runs = samples.get("c chatapp disk (new process)", [])
        seconds = [run["second_request_same_process"] for run in disk_runs if "second_request_same_process" in run]
        if seconds:
            lines.append(
                "   disk child: process ready (load + self-test + index) "
                f"{median([run['process_ready_ms'] for run in disk_runs]):.0f} ms; way-back decode "
                f"{median([run['phases_ms'].get('decode', 0) for run in disk_runs]):.0f} ms for "
                f"{median([run['computed_tokens'] for run in disk_runs]):.0f} tokens; a second request in the same child "
                f"(tier {seconds[-1]['tier']}): TTFT {median([x['ttft_ms'] for x in seconds]):.0f} ms, decode "
                f"{median([x['phases_ms'].get('decode', 0) for x in seconds]):.0f} ms for {median([x['computed_tokens'] for x in seconds]):.0f} tokens"
            )
        lines.append("   phase medians in ms (min-max):")
        for name, runs in samples.items():
            keys = list(runs[0].get("phases_ms", {}))
            parts = []
            for key in keys:
                values = [run["phases_ms"].get(key, 0.0) for run in runs]
                parts.append(f"{key} {median(values):.1f} ({min(values):.0f}-{max(values):.0f})")
            post = [run["post_answer_engine_ms"] for run in runs if "post_answer_engine_ms" in run]
            if post and max(post) > 0.5:
                parts.append(f"after-answer engine {median(post):.0f} ({min(post):.0f}-{max(post):.0f})")
            save = [run["after_first_token_ms (cache save)"] for run in runs if "after_first_token_ms (cache save)" in run]
            if save and max(save) > 0.5:
                parts.append(f"after-answer cache save {median(save):.0f} ({min(save):.0f}-{max(save):.0f})")
            lines.append(f"     {name.split(' ', 1)[0]:3} " + ", ".join(parts))
    b = results.get("B")
    if b:
        lines.append(f"B. Cold prefill of {b['tokens']} tokens (tokens/s, median)")
        base = None
        for name, values in b["samples_ms"].items():
            rate = b["tokens"] / median(values) * 1000
            base = base or rate
            lines.append(f"   {name:66} {rate:8.1f} tok/s  ({rate / base:.3f}x chatapp)")
    c = results.get("C")
    if c:
        lines.append(f"C. Lookup with {c['conversations']:,} conversations ({c['blocks']:,} blocks; built in {c['build_s']:.1f} s), target <= 1 ms")
        for name, values in c["lookups"].items():
            extra = f" p99 {values['p99_ms']:.3f} max {values['max_ms']:.3f} matched {values['median_matched_tokens']}" if "p99_ms" in values else ""
            verdict = "ok" if values["median_ms"] <= 1.0 else "MISS"
            lines.append(f"   {name:58} median {values['median_ms']:.3f} ms{extra} {verdict if 'p99_ms' in values else ''}")
    d = results.get("D")
    if d:
        verdict = "ok" if d["ratio_folder_apparent"] <= 1.3 else "MISS"
        lines.append(
            f"D. Storage, {d['conversations']} conversations: {d['unique_tokens']:,} unique tokens x {d['kv_bytes_per_token']:,} B = "
            f"{d['unique_kv_bytes'] / MIB:.1f} MiB; folder {d['folder_apparent_bytes'] / MIB:.1f} MiB "
            f"(allocated {d['folder_allocated_bytes'] / MIB:.1f}); payloads {d['stored_payload_bytes'] / MIB:.1f} MiB in "
            f"{d['index_entries']} blocks ({d['partial_blocks']} partial)"
        )
        lines.append(
            f"   ratio folder/unique {d['ratio_folder_apparent']:.3f} (allocated {d['ratio_folder_allocated']:.3f}, payload only "
            f"{d['ratio_payload']:.3f}), target <= 1.3 {verdict}"
        )
    e = results.get("E")
    if e:
        samples = e["samples"]
        names = list(samples)
        base = median([s["ttft_ms"] for s in samples["engine without a cache (--no-cache)"]])
        lines.append(f"E. No-hit request ({e['prompt_tokens']} tokens), median TTFT of {len(samples[names[0]])}, target cache-on <= 1.02x")
        for name in names:
            ttfts = [s["ttft_ms"] for s in samples[name]]
            post = median([s["post_answer_engine_ms"] for s in samples[name]])
            flush = median([s["background_flush_ms"] for s in samples[name]])
            lines.append(f"   {name:40} {median(ttfts):9.1f} ms  {median(ttfts) / base:.3f}x  (after answer: engine {post:.1f} ms, writer {flush:.1f} ms)")
        on = [s["ttft_ms"] for s in samples["cache on (use_cache=True)"]]
        off = [s["ttft_ms"] for s in samples["engine without a cache (--no-cache)"]]
        same = [s["ttft_ms"] for s in samples["same engine, use_cache=False"]]
        pair = median([x / y for x, y in zip(on, off)])
        pair_same = median([x / y for x, y in zip(on, same)])
        def overhead(run: dict) -> float:
            return run["ttft_ms"] - run.get("phases_ms", {}).get("decode", 0.0)

        extra_on = median([overhead(run) for run in samples["cache on (use_cache=True)"]])
        extra_off = median([overhead(run) for run in samples["engine without a cache (--no-cache)"]])
        model = (base + extra_on - extra_off) / base
        verdict = "ok" if model <= 1.02 else "MISS"
        lines.append(
            f"   median per-pair ratio: on/--no-cache {pair:.3f} {'ok' if pair <= 1.02 else 'MISS'}; "
            f"on/use_cache=False same engine {pair_same:.3f} {'ok' if pair_same <= 1.02 else 'MISS'}"
        )
        lines.append(
            f"   overhead (TTFT minus decode): cache on {extra_on:.2f} ms, --no-cache {extra_off:.2f} ms; model {model:.4f}x {verdict}"
            " (wall-clock ratios of different engine instances scatter by several % even when idle)"
        )
        e["pair_ratio"] = pair
        e["pair_ratio_same_engine"] = pair_same
        e["model_ratio"] = model
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="~500-token personas, fewer repetitions (about a minute)")
    parser.add_argument("--json", type=Path, help="write every sample and summary to this file")
    parser.add_argument("--reps", type=int, help="repetitions of each timed variant (default 3, quick 3)")
    parser.add_argument("--sections", default="ABCDE", help="which sections to run (default ABCDE)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--context", type=int, default=4096, help="context per sequence, for every variant")
    parser.add_argument("--keep", action="store_true", help="keep the temporary cache folders")
    parser.add_argument("--summarize", type=Path, help="print the tables of a saved --json file and exit")
    parser.add_argument("--child-disk", help=argparse.SUPPRESS)
    parser.add_argument("--child-tokens", help=argparse.SUPPRESS)
    parser.add_argument("--child-sequences", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--child-fingerprint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_disk:
        child_disk(args)
        return
    if args.summarize:
        saved = json.loads(args.summarize.read_text())
        print("\n".join(summarize(saved)))
        return

    if args.quick:
        sizes = Sizes(persona=500, question=60, reps=3, prefill_tokens=500, prefill_reps=2, conversations=6,
                      lookup_conversations=10_000, nohit_reps=3, nohit_persona=150, drop_page_cache=False)
    else:
        sizes = Sizes(persona=2000, question=200, reps=3, prefill_tokens=2000, prefill_reps=3, conversations=50,
                      lookup_conversations=10_000, nohit_reps=7, nohit_persona=600, drop_page_cache=True)
    if args.reps:
        sizes.reps = args.reps
    model_path = bundled_model_path()
    started = time.perf_counter()
    load = os.getloadavg()
    header = [
        f"cache_bench: model {model_path.name}, llama-cpp-python {llama_cpp.__version__}, threads {args.threads}, "
        f"context {args.context}/sequence, block {BLOCK_SIZE}, {'quick' if args.quick else 'full'}, "
        f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
    ]
    log(header[0])
    fingerprint = hash_file(model_path)
    results: dict[str, object] = {"sizes": sizes.__dict__, "threads": args.threads, "context": args.context, "load_start": load}
    work = Path(tempfile.mkdtemp(prefix="cache_bench-"))
    engines: dict[str, object] = {}
    try:
        need_models = any(section in args.sections for section in "ABE")
        if need_models:
            engines["ideal"] = Bench("ideal", make_engine(model_path, folder=None, sequences=2, context=args.context, threads=args.threads, fingerprint=None))
            engines["cold"] = Bench("cold", make_engine(model_path, folder=None, sequences=2, context=args.context, threads=args.threads, fingerprint=None))
            engines["llama"] = make_llama(model_path, context=args.context, threads=args.threads, flash_attn=False)
            texts = TextMaker(lambda text: engines["ideal"].engine.tokenize(text))
        else:
            from chatapp.engine.llama_native import NativeModel

            vocab = NativeModel(model_path, vocab_only=True)
            texts = TextMaker(lambda text: vocab.tokenize(text, add_special=False, parse_special=False))
        if "A" in args.sections:
            results["A"] = section_a(args, sizes, model_path, fingerprint, work, texts, engines)
        if "B" in args.sections:
            results["B"] = section_b(args, sizes, model_path, texts, engines)
        if "C" in args.sections:
            results["C"] = section_c(sizes)
        if "D" in args.sections:
            results["D"] = section_d(args, sizes, model_path, fingerprint, work, texts)
        if "E" in args.sections:
            if "device" not in engines:
                engines["device"] = Bench("device", make_engine(model_path, folder=work / "kv-e", sequences=2, context=args.context, threads=args.threads, fingerprint=fingerprint))
            results["E"] = section_e(sizes, texts, engines)
    finally:
        for name, engine in engines.items():
            if isinstance(engine, Bench):
                engine.close()
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    load_end = os.getloadavg()
    results["load_end"] = load_end
    results["elapsed_s"] = time.perf_counter() - started
    lines = header + summarize(results)
    lines.append(f"elapsed {results['elapsed_s']:.0f} s; load average at end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
