"""Faults on a real engine's cache (the tiny random-weight model, one thread): damaged entries,
kills while storing, two processes on one folder, other models or settings on the folder.
In every case an answer must equal a cold run's: when in doubt, the cache misses."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cache.keys import as_token_array
from chatapp.services.library import open_library
from chatapp.services.startup import open_workspace
from tests.chatapp.engine.fault_support import (
    MIN_REQUESTS,
    FaultEngineOptions,
    answer,
    cold_answers,
    damage_row,
    fault_engine,
    prompt_pool,
)
from tests.child_support import start_child
from tests.model_factory import write_tiny_llama

# Fault injection: kills, two processes for 15 s, 100 damaged entries.
pytestmark = pytest.mark.slow

CORRUPTION_CASES = 100
KILLS = 20
TWO_PROCESS_SECONDS = 15.0


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture(scope="module")
def reference(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, ...], tuple[int, ...]]:
    """Every pool prompt's answer computed cold (no cache at all)."""
    with fault_engine(tmp_path_factory.mktemp("cold"), tiny_model) as engine:
        return cold_answers(engine, prompt_pool(engine))


def start_asker(
    model: Path, folder: Path, seconds: float, seed: int, data_dir: Path | None = None
) -> subprocess.Popen[str]:
    extra = [str(data_dir)] if data_dir is not None else []
    args = ("ask", str(model), str(folder), str(seconds), str(seed), *extra)
    return start_child("tests.chatapp.engine.fault_support", *args, first_line="ready")


def verify_folder(folder: Path, model: Path, reference: dict[tuple[int, ...], tuple[int, ...]]) -> int:
    """Open the folder as after a crash (the disk tier must open), ask: answers equal cold ones.

    Returns how many prompt tokens were reused from disk (to show the cache was used).
    """
    with fault_engine(folder, model) as engine:
        assert engine.cache is not None
        assert engine.cache.disk.enabled, engine.cache.problem
        reused = 0
        for tokens in random.Random(len(folder.name)).sample(sorted(reference), min(4, len(reference))):
            result = answer(engine, tokens)
            assert result.token_ids == reference[tokens]
            reused += result.stats.reused_tokens if result.stats.reuse_tier == "disk" else 0
        return reused


def test_100_damaged_entries_are_detected_dropped_and_recomputed(
    tiny_model: Path, reference: dict[tuple[int, ...], tuple[int, ...]], tmp_path: Path
) -> None:
    """Byte flips and truncations of payloads (files and database rows) while the engine runs, then
    of records (row tags) before a restart: each is refused, and the answer is the cold one."""
    rng = random.Random(7)
    prompts = sorted(reference)
    kinds: dict[str, int] = {}
    with fault_engine(tmp_path, tiny_model, ram_bytes=0) as engine:  # no RAM tier: every restore reads the disk
        for tokens in prompts:
            answer(engine, tokens)
        engine.flush_cache()
        assert engine.cache is not None
        for case in range(CORRUPTION_CASES):
            target = prompts[case % len(prompts)]
            blocks = engine.cache.lookup(as_token_array(target)).blocks
            assert blocks, "the prompt's blocks are stored again after every answer"
            victim = rng.choice(blocks)
            store = tmp_path / ("pinned" if victim.pinned else "blocks")
            kind = damage_row(store, victim.key.hex(), rng)
            kinds[kind] = kinds.get(kind, 0) + 1
            answer(engine, prompts[(case + len(prompts) // 2) % len(prompts)])  # another persona takes the sequence
            result = answer(engine, target)
            assert result.token_ids == reference[target], f"case {case}: {kind}"
            restored = result.stats.reuse_tier == "disk"
            assert not restored or result.stats.reused_tokens <= victim.start, (
                f"case {case}: a damaged block was used ({kind})"
            )
            engine.flush_cache()
    print(f"{CORRUPTION_CASES} damaged payloads: {kinds}")
    assert sum(kinds.values()) == CORRUPTION_CASES
    assert len(kinds) >= 4


def test_damaged_records_are_refused_after_a_restart(
    tiny_model: Path, reference: dict[tuple[int, ...], tuple[int, ...]], tmp_path: Path
) -> None:
    import sqlite3

    rng = random.Random(11)
    with fault_engine(tmp_path, tiny_model) as engine:
        for tokens in sorted(reference):
            answer(engine, tokens)
    with sqlite3.connect(tmp_path / "blocks" / "cache.db") as db:
        rows = db.execute("SELECT key, tag FROM Cache").fetchall()
        damaged = rng.sample(rows, len(rows) // 2)
        for key, tag in damaged:
            data = bytearray(tag)
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            db.execute("UPDATE Cache SET tag = ? WHERE key = ?", (sqlite3.Binary(bytes(data)), key))
    with fault_engine(tmp_path, tiny_model) as engine:
        assert engine.cache is not None
        indexed = {info.key.hex() for info in engine.cache.index.entries.values()}
        assert indexed.isdisjoint(key for key, _ in damaged)
        assert len(indexed) == len(rows) - len(damaged)
        for tokens in sorted(reference):
            assert answer(engine, tokens).token_ids == reference[tokens]


def test_20_kills_while_storing_never_leave_a_bad_entry(
    tiny_model: Path, reference: dict[tuple[int, ...], tuple[int, ...]], tmp_path: Path
) -> None:
    """SIGKILL at random moments of a process that asks and stores without pause."""
    rng = random.Random(3)
    reused_after_kills = 0
    for kill in range(KILLS):
        asker = start_asker(tiny_model, tmp_path, 120, seed=kill)
        time.sleep(rng.uniform(0.05, 1.5))
        asker.send_signal(signal.SIGKILL)
        asker.wait(30)
        assert asker.returncode == -signal.SIGKILL
        reused_after_kills += verify_folder(tmp_path, tiny_model, reference)
    print(f"{KILLS} kills; prompt tokens reused from disk after them: {reused_after_kills}")
    assert reused_after_kills > 0


def test_two_processes_share_one_data_folder_for_15_seconds(tiny_model: Path, tmp_path: Path) -> None:
    """Both ask, store, evict and cull in one KV cache folder, and save every message in one database."""
    data_dir = tmp_path / "data"
    kv = data_dir / "cache" / "kv"
    askers = [start_asker(tiny_model, kv, TWO_PROCESS_SECONDS, seed=seed, data_dir=data_dir) for seed in (1, 2)]
    reports = []
    for asker in askers:
        out, err = asker.communicate(timeout=TWO_PROCESS_SECONDS + 600)  # a hang guard only
        assert asker.returncode == 0, err
        assert "Traceback" not in err
        assert "could not store" not in err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    print(f"two processes for {TWO_PROCESS_SECONDS:.0f} s: {reports}")
    assert all(report["mismatches"] == 0 and report["requests"] >= MIN_REQUESTS for report in reports)
    library = open_library(open_workspace(str(data_dir), {"model": str(tiny_model)}))
    try:
        saved = {
            conversation.title: len(library.conversations.messages(conversation.id))
            for conversation in library.conversations.list_conversations()
        }
    finally:
        library.close()
    assert saved == {f"asker {seed}": 1 + 2 * report["requests"] for seed, report in zip((1, 2), reports, strict=True)}
    verify_folder(kv, tiny_model, {})


@pytest.mark.parametrize("change", ["model", "context", "flash attention"])
def test_another_model_or_setting_on_the_folder_never_restores(change: str, tiny_model: Path, tmp_path: Path) -> None:
    folder = tmp_path / "kv"
    model = write_tiny_llama(tmp_path / "other.gguf", seed=1) if change == "model" else tiny_model
    with fault_engine(folder, tiny_model) as first:
        tokens = prompt_pool(first)[0]
        answer(first, tokens)
    options: FaultEngineOptions = {"context": 512} if change == "context" else {}
    if change == "flash attention":
        options = {"flash_attention": True}
    with fault_engine(folder, model, **options) as second:
        if change == "flash attention":
            assert second.info.flash_attention, "this llama.cpp build has no flash attention on CPU"
        assert second.cache is not None
        assert len(second.cache.index) == 0
        result = answer(second, tokens)
        cold = answer(second, tokens, use_cache=False)
        assert result.stats.reused_tokens == 0
        assert result.token_ids == cold.token_ids
    with fault_engine(folder, tiny_model) as again:  # the first namespace's entries are still there
        assert answer(again, tokens).stats.reuse_tier == "disk"


def test_cache_files_are_private(tiny_model: Path, tmp_path: Path) -> None:
    old_umask = os.umask(0o077)  # as the app sets it at start-up (chatapp.services.startup.make_new_files_private)
    try:
        with fault_engine(tmp_path / "kv", tiny_model) as engine:
            for tokens in prompt_pool(engine)[:3]:
                answer(engine, tokens)
    finally:
        os.umask(old_umask)
    modes = {
        path.relative_to(tmp_path).as_posix(): path.stat().st_mode & 0o777 for path in (tmp_path / "kv").rglob("*")
    }
    assert any(name.endswith((".val", ".seg")) for name in modes)
    assert any(name.endswith("cache.db") for name in modes)
    loose = {name: oct(mode) for name, mode in modes.items() if mode not in (0o600, 0o700)}
    assert not loose
