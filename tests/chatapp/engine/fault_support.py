"""Helpers for the fault tests: a tiny model's engines on one cache folder, prompts, damage.

Also run as a script by the kill and two-process tests:

    python -m tests.chatapp.engine.fault_support ask MODEL FOLDER SECONDS SEED

asks prompts from `prompt_pool()` in a random order through a cached engine for SECONDS
(with small budgets, so that blocks are culled and evicted as they are written), checks
each answer against a cold run of the same engine, prints "ready" once the engine is up,
then one JSON line {"requests", "mismatches"} when done. Exit status 0 when every answer
matched.
"""

from __future__ import annotations

import json
import random
import sqlite3
import sys
import time
from pathlib import Path
from typing import TypedDict

from chatapp.engine.engine import Engine
from chatapp.engine.events import GenerationResult
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.prompting.prompt import ChatMessage
from chatapp.services.library import open_library
from chatapp.services.startup import open_workspace
from chatapp.vocabulary import Role
from tests.cache.damage import payload_place
from tests.cache_support import cached_engine
from tests.model_factory import TINY_MODEL_THREADS

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)
MIN_REQUESTS = 10  # what the two-process test counts on, whatever the machine's speed
BLOCK = 128  # 128 tokens of the tiny model's KV: 32 KiB, so full blocks are files, partial ones rows
PERSONAS = [
    "You are a careful archivist. Quote sources, give dates as 2024-03-15, keep answers short. " * 9,
    "You are a ship's navigator. Speak of tides, stars and charts; never guess a position. " * 9,
]
QUESTIONS = [
    "Where is the map?",
    "What year was it?",
    "Who signed the letter?",
    "How far is the port?",
    "Which star is brightest?",
    "Why did the tide turn?",
]


class FaultEngineOptions(TypedDict, total=False):
    """The keyword options of fault_engine, for a test that picks some of them per case."""

    context: int
    ram_bytes: int
    disk_bytes: int
    flash_attention: bool
    sequences: int


def fault_engine(
    folder: Path,
    model: Path,
    *,
    context: int = 1024,
    ram_bytes: int = 64 << 20,
    disk_bytes: int = 1 << 30,
    flash_attention: bool = False,
    sequences: int = 1,
) -> Engine:
    return cached_engine(
        folder,
        model,
        block_size=BLOCK,
        context=context,
        sequences=sequences,
        threads=TINY_MODEL_THREADS,
        flash_attention=flash_attention,
        ram_bytes=ram_bytes,
        disk_bytes=disk_bytes,
    )


def prompt_pool(engine: Engine) -> list[tuple[int, ...]]:
    return [
        tuple(engine.prompt_builder.build([ChatMessage.of(Role.SYSTEM, persona), ChatMessage.of(Role.USER, question)]))
        for persona in PERSONAS
        for question in QUESTIONS
    ]


def answer(engine: Engine, tokens: tuple[int, ...], *, use_cache: bool = True) -> GenerationResult:
    return engine.generate(GenerationRequest(tokens, GREEDY, use_cache=use_cache)).wait()


def cold_answers(engine: Engine, prompts: list[tuple[int, ...]]) -> dict[tuple[int, ...], tuple[int, ...]]:
    return {tokens: answer(engine, tokens, use_cache=False).token_ids for tokens in prompts}


def damage_row(store: Path, key_hex: str, rng: random.Random) -> str:
    """Damage one stored payload, in its file or in the database row; returns what was done."""
    with sqlite3.connect(store / "cache.db", timeout=30) as db:
        row = db.execute("SELECT filename, value FROM Cache WHERE key = ?", (key_hex,)).fetchone()
        if row is None:
            return "gone"
        filename, value = row
        if filename:
            path, start, end = payload_place(store, filename)  # in a segment, its neighbours suffer too
            data = bytearray(path.read_bytes())
            end = len(data) if end is None else end
            kind = rng.choice(["flip", "truncate", "remove"])
            if kind == "flip":
                data[rng.randrange(start, end)] ^= 1 << rng.randrange(8)
                path.write_bytes(bytes(data))
            elif kind == "truncate":
                path.write_bytes(bytes(data[: rng.randrange(start, end)]))
            else:
                path.unlink()
            return f"file {kind}"
        data = bytearray(value)
        kind = rng.choice(["flip", "truncate"])
        if kind == "flip":
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        else:
            data = data[: rng.randrange(len(data))]
        db.execute("UPDATE Cache SET value = ? WHERE key = ?", (sqlite3.Binary(bytes(data)), key_hex))
        return f"row {kind}"


def ask_for(model: Path, folder: Path, seconds: float, seed: int, data_dir: Path | None = None) -> int:
    """Ask for `seconds`, and at least MIN_REQUESTS times however slow the machine; with `data_dir`,
    the cache is its cache folder and every question and answer is also saved in its conversations
    database, as the app does."""
    rng = random.Random(seed)
    library = open_library(open_workspace(str(data_dir), {"model": str(model)})) if data_dir else None
    conversation = library.conversations.create_conversation(f"asker {seed}") if library else None
    root = (
        library.conversations.add_root(conversation.id, persona_name=None, persona_prompt="", document_id=None)
        if library and conversation
        else None
    )
    # Small budgets (a few prompts' worth): blocks are evicted from RAM and culled on disk all the time.
    with fault_engine(folder, model, ram_bytes=128 << 10, disk_bytes=256 << 10) as engine:
        prompts = prompt_pool(engine)
        reference = cold_answers(engine, prompts)
        print("ready", flush=True)
        requests = mismatches = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline or requests < MIN_REQUESTS:
            tokens = rng.choice(prompts)
            requests += 1
            result = answer(engine, tokens)
            mismatches += result.token_ids != reference[tokens]
            if library is not None and conversation is not None and root is not None:
                question = library.conversations.add_message(
                    conversation.id, root.id, Role.USER, f"prompt {prompts.index(tokens)}"
                )
                library.conversations.add_message(
                    conversation.id, question.id, Role.ASSISTANT, result.text, generated_ids=result.token_ids
                )
    if library is not None:
        library.close()
    print(json.dumps({"requests": requests, "mismatches": mismatches}), flush=True)
    return 0 if mismatches == 0 else 1


if __name__ == "__main__":
    command, model_arg, folder_arg, seconds_arg, seed_arg = sys.argv[1:6]
    assert command == "ask"
    data_arg = Path(sys.argv[6]) if len(sys.argv) > 6 else None
    raise SystemExit(ask_for(Path(model_arg), Path(folder_arg), float(seconds_arg), int(seed_arg), data_arg))
