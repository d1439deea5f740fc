"""Quantized KV cells (q8_0, q4_0): smaller states, kept apart from f16's, restored exactly.

Every restore is compared with a cold run of the same type on the same machine: a quantized
cache answers a little unlike f16 (that is its cost), never unlike itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cache.llama_state import read_sequence_state
from cache.state_format import parse_state
from chatapp.engine.batching import FLASH_ATTENTION_ROWS
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.events import GenerationResult
from chatapp.engine.kv_types import KvType
from chatapp.engine.llama_native import NativeContext, NativeModel
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.errors import ModelError
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import ReuseTier, Role
from tests.cache_support import cached_engine
from tests.model_factory import write_tiny_llama

GREEDY = SamplingParams(temperature=0.0, max_tokens=10)
PERSONA = "You are a careful reviewer of essays. You point out unclear sentences, one at a time. " * 6
QUANTIZED = [KvType.Q8_0, KvType.Q4_0]


def prompt(engine: Engine, persona: str, question: str) -> tuple[int, ...]:
    messages = [ChatMessage.of(Role.SYSTEM, persona), ChatMessage.of(Role.USER, question)]
    return tuple(engine.prompt_builder.build(messages))


def answer(engine: Engine, tokens: tuple[int, ...], *, use_cache: bool = True) -> GenerationResult:
    return engine.generate(GenerationRequest(tokens, GREEDY, use_cache=use_cache)).wait()


def push_out(engine: Engine) -> None:
    """Every sequence made to hold something else, and the cache's writes finished."""
    engine.flush_cache()
    for sequence in range(engine.info.n_sequences):
        request = GenerationRequest(prompt(engine, "Be brief.", "Hi."), GREEDY, sequence=sequence, use_cache=False)
        engine.generate(request).wait()
    engine.flush_cache()


@pytest.fixture(scope="module", params=QUANTIZED, ids=str)
def kv_type(request: pytest.FixtureRequest) -> KvType:
    return KvType(request.param)


@pytest.fixture(scope="module")
def cold(model_path: Path, kv_type: KvType) -> Iterator[Engine]:
    """The reference: the same type, no cache, every prompt computed whole."""
    with Engine(EngineConfig(model_path=model_path, context_cap=1024, sequences=1, kv_type=kv_type)) as engine:
        yield engine


def bytes_per_token(model: NativeModel, kv_type: KvType) -> int:
    context = NativeContext(model, n_sequences=1, n_ctx_per_sequence=256, n_threads=2, kv_type=kv_type)
    try:
        assert context.shape.kv_type is kv_type
        assert context.shape.flash_attention == kv_type.quantized
        tokens = model.tokenize(PERSONA, add_special=True, parse_special=False)[:100]
        context.decode(tokens, start_pos=0, sequence=0, logits_for_last=True)
        state = read_sequence_state(context.pointer, 0)
        layout = parse_state(state, model.memory).layout(model.memory)
        return layout.bytes_per_cell
    finally:
        context.close()


def test_quantized_states_hold_a_token_in_half_or_a_quarter_of_the_bytes(model_path: Path) -> None:
    model = NativeModel(model_path)
    try:
        f16, q8_0, q4_0 = (bytes_per_token(model, kv_type) for kv_type in (KvType.F16, KvType.Q8_0, KvType.Q4_0))
    finally:
        model.close()
    assert q8_0 / f16 == pytest.approx(KvType.Q8_0.bytes_per_value / KvType.F16.bytes_per_value) == 34 / 64
    assert q4_0 / f16 == pytest.approx(KvType.Q4_0.bytes_per_value / KvType.F16.bytes_per_value) == 18 / 64


def test_restores_from_every_tier_equal_a_cold_run_of_the_same_type(
    tmp_path: Path, model_path: Path, kv_type: KvType, cold: Engine
) -> None:
    folder = tmp_path / "kv"
    first = prompt(cold, PERSONA, "Is this sentence clear: 'the cat the dog chased ran'?")
    variant = prompt(cold, PERSONA, "Is this one clear: 'we saw her duck'?")
    expected = {tokens: answer(cold, tokens, use_cache=False).token_ids for tokens in (first, variant)}
    with cached_engine(folder, model_path, kv_type=kv_type) as cached:
        assert cached.info.kv_type == kv_type.value
        assert cached.info.flash_attention
        assert answer(cached, first).token_ids == expected[first]
        push_out(cached)
        whole = answer(cached, first)  # the whole state kept ready
        assert whole.stats.reuse_tier == ReuseTier.RAM
        assert whole.stats.reused_tokens == len(first) - FLASH_ATTENTION_ROWS
        assert whole.token_ids == expected[first]
        push_out(cached)
        cached.drop_ready_states()
        blocks = answer(cached, variant)  # RAM blocks, cut inside a block after the shared persona
        assert blocks.stats.reuse_tier == ReuseTier.RAM
        assert blocks.stats.reused_tokens > len(PERSONA) // 8
        assert blocks.token_ids == expected[variant]
    with cached_engine(folder, model_path, kv_type=kv_type) as restarted:
        from_disk = answer(restarted, variant)
        assert from_disk.stats.reuse_tier == ReuseTier.DISK
        assert from_disk.stats.reused_tokens == len(variant) - FLASH_ATTENTION_ROWS
        assert from_disk.token_ids == expected[variant]


def test_a_state_never_restores_into_a_context_of_another_type(tmp_path: Path, model_path: Path) -> None:
    folder = tmp_path / "kv"
    with cached_engine(folder, model_path, kv_type=KvType.Q8_0) as quantized:
        tokens = prompt(quantized, PERSONA, "Which sentence is the weakest?")
        answer(quantized, tokens)
        quantized.flush_cache()
    with cached_engine(folder, model_path) as f16:  # another layout, so another namespace
        again = answer(f16, tokens)
        assert again.stats.reuse_tier == ReuseTier.NONE
        assert again.stats.reused_tokens == 0
    with cached_engine(folder, model_path, kv_type=KvType.Q8_0) as same:
        assert answer(same, tokens).stats.reuse_tier == ReuseTier.DISK  # still there for its own type


def test_a_model_whose_heads_do_not_fit_the_type_gets_a_clear_error(tmp_path: Path) -> None:
    tiny = write_tiny_llama(tmp_path / "tiny.gguf")  # heads of 16 values: a q8_0 block is 32
    with pytest.raises(ModelError, match="set kv_type to f16"):
        Engine(EngineConfig(model_path=tiny, context_cap=256, sequences=1, kv_type=KvType.Q8_0)).close()
