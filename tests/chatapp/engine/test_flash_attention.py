"""Flash attention with exact restores: every batch has the rows of llama.cpp's tiled kernel.

llama.cpp's CPU flash attention computes each query row alike in any batch of 64 rows or
more (GGML_FA_TILE_Q), and with other kernels below that. With every batch that large, a
restore and a cold run compute the same bits, which these tests check on the bundled model.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from chatapp.engine.batching import FLASH_ATTENTION_ROWS
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.events import GenerationResult
from chatapp.engine.llama_native import NativeContext, NativeModel
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import Role
from tests.cache_support import cached_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
PERSONA = "You are a patient tutor. You explain one idea at a time, with a short example. " * 8


@pytest.fixture(scope="module")
def cold(model_path: Path) -> Iterator[Engine]:
    """The reference: flash attention, no cache, every prompt computed whole."""
    config = EngineConfig(model_path=model_path, context_cap=1024, sequences=1, flash_attention=True)
    with Engine(config) as engine:
        if not engine.info.flash_attention:
            pytest.skip("this llama.cpp build has no flash attention")
        yield engine


@pytest.fixture
def cached(tmp_path: Path, model_path: Path) -> Iterator[Engine]:
    with cached_engine(tmp_path / "kv", model_path, flash_attention=True) as engine:
        assert engine.info.flash_attention
        yield engine


def prompt(engine: Engine, *messages: tuple[Role, str]) -> tuple[int, ...]:
    return tuple(engine.prompt_builder.build([ChatMessage.of(role, text) for role, text in messages]))


def answer(engine: Engine, tokens: tuple[int, ...], *, use_cache: bool = True) -> GenerationResult:
    return engine.generate(GenerationRequest(tokens, GREEDY, use_cache=use_cache)).wait()


def push_out(engine: Engine) -> None:
    engine.flush_cache()
    for sequence in range(engine.info.n_sequences):
        request = GenerationRequest(prompt(engine, (Role.USER, "Hi.")), GREEDY, sequence=sequence, use_cache=False)
        engine.generate(request).wait()


def test_batches_of_the_tiled_kernels_rows_give_the_same_logits(model_path: Path) -> None:
    """The fact the rest rests on, checked on this llama.cpp: any split into batches of 64 or more."""
    model = NativeModel(model_path)
    try:
        context = NativeContext(model, n_sequences=1, n_ctx_per_sequence=1024, n_threads=2, flash_attention=True)
        if not context.shape.flash_attention:
            pytest.skip("this llama.cpp build has no flash attention")
        tokens = model.tokenize(PERSONA * 2, add_special=True, parse_special=False)[:300]

        def final_logits(splits: list[int]) -> np.ndarray:
            return context.logits_split_at(tokens, splits)

        whole = final_logits([])
        rows = FLASH_ATTENTION_ROWS
        for splits in ([rows], [100], [100, 236], [len(tokens) - rows]):
            assert np.array_equal(final_logits(splits), whole), splits
        # The reason for the rule: one batch of fewer rows takes other kernels.
        assert not np.array_equal(final_logits([len(tokens) - 10]), whole)
        context.close()
    finally:
        model.close()


def test_restores_and_a_cut_inside_a_block_equal_a_cold_run(cached: Engine, cold: Engine) -> None:
    first = prompt(cached, (Role.SYSTEM, PERSONA), (Role.USER, "Explain the word 'because'."))
    answer(cached, first)
    push_out(cached)
    again = answer(cached, first)  # a whole state kept ready
    assert again.stats.reuse_tier == "ram"
    assert again.stats.reused_tokens == len(first) - FLASH_ATTENTION_ROWS  # every answer computes 64
    assert again.token_ids == answer(cold, first, use_cache=False).token_ids
    push_out(cached)
    variant = prompt(cached, (Role.SYSTEM, PERSONA), (Role.USER, "Explain the word 'although', please."))
    warm = answer(cached, variant)
    assert warm.stats.reused_tokens > len(PERSONA) // 8
    assert warm.token_ids == answer(cold, variant, use_cache=False).token_ids


def test_a_conversation_continued_in_place_equals_a_cold_run(cached: Engine, cold: Engine) -> None:
    question = (Role.USER, "What is a noun?")
    first = answer(cached, prompt(cached, (Role.SYSTEM, PERSONA), question))
    follow_up = prompt(
        cached, (Role.SYSTEM, PERSONA), question, (Role.ASSISTANT, first.text), (Role.USER, "And a verb?")
    )
    cached.flush_cache()  # the answer's tokens computed again in a batch of 64 or more
    second = answer(cached, follow_up)
    assert second.stats.reuse_tier == "device"
    assert second.token_ids == answer(cold, follow_up, use_cache=False).token_ids


def test_a_prompt_shorter_than_a_batch_is_never_reused(cached: Engine, cold: Engine) -> None:
    short = prompt(cached, (Role.USER, "Hi."))
    assert len(short) < FLASH_ATTENTION_ROWS
    answer(cached, short)
    cached.flush_cache()
    longer = prompt(cached, (Role.USER, "Hi. " + "Tell me about the sea and its tides, slowly. " * 6))
    warm = answer(cached, longer)
    assert warm.stats.reused_tokens == 0  # its first tokens were computed by other kernels
    assert warm.token_ids == answer(cold, longer, use_cache=False).token_ids


def test_a_short_warm_up_keeps_no_checkpoint_of_the_other_kernels(tmp_path: Path) -> None:
    """On a sliding-window model a warm-up checkpoints its end: not when it was one short batch."""
    from tests.model_factory import write_tiny_gemma3

    model = write_tiny_gemma3(tmp_path / "gemma3.gguf")
    with cached_engine(tmp_path / "kv", model, flash_attention=True, threads=1) as engine:
        assert engine.takes_checkpoints
        short = prompt(engine, (Role.SYSTEM, "You are terse."))
        assert len(short) < FLASH_ATTENTION_ROWS
        request = GenerationRequest(short, GREEDY, prefill_only=True, checkpoints=(len(short),))
        engine.generate(request).wait()
        engine.flush_cache()
        assert engine.cache is not None
        assert not engine.cache.has_checkpoint(list(short))
        longer = prompt(engine, (Role.SYSTEM, PERSONA))  # one batch of 64 or more: checkpointed
        engine.generate(GenerationRequest(longer, GREEDY, prefill_only=True, checkpoints=(len(longer),))).wait()
        engine.flush_cache()
        assert engine.cache.has_checkpoint(list(longer))
