"""The offload path: every layer on a device (a GPU, or Mesa's llvmpipe through Vulkan), the KV cells
and the states restored there.

These need a llama.cpp built for a device. On a CPU build they are skipped, and the summary says
why; `make test-vulkan` builds llama.cpp with Vulkan and runs them, with the memory-kind, property
and batching tests (marked `device`), on llvmpipe where the machine has no GPU.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from chatapp.engine.device_turns import DEVICE
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.gate import Step
from chatapp.engine.llama_native import NativeModel, offload_device
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.vocabulary import ReuseTier
from tests.cache_support import cached_engine
from tests.model_factory import TINY_MODEL_THREADS, write_tiny_gemma3, write_tiny_llama

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(
        offload_device() is None,
        reason="no offload device in this llama.cpp build: `make test-vulkan` runs these on a Vulkan device",
    ),
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=6)
PROMPT = tuple(range(5, 70))  # tokens of the tiny model's vocabulary


def test_every_layer_runs_on_the_device_and_the_model_card_names_it(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    model = NativeModel(path)
    layers = model.n_layer
    model.close()
    config = EngineConfig(model_path=path, context_cap=256, sequences=1, threads=TINY_MODEL_THREADS)
    with Engine(config) as engine:
        assert engine.info.gpu_layers == layers + 1  # the repeating layers and the output layer
        assert engine.info.device == offload_device()
        assert engine.generate(GenerationRequest(PROMPT, GREEDY)).wait().token_ids


def test_a_state_restored_onto_the_device_answers_as_a_cold_run_there(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    cold_config = EngineConfig(model_path=path, context_cap=256, sequences=1, threads=TINY_MODEL_THREADS)
    with Engine(cold_config) as cold:
        expected = cold.generate(GenerationRequest((*PROMPT, 90), GREEDY, use_cache=False)).wait().token_ids
    folder = tmp_path / "cache"
    with cached_engine(folder, path, block_size=16, context=256, sequences=1, threads=TINY_MODEL_THREADS) as first:
        first.generate(GenerationRequest(PROMPT, GREEDY)).wait()
        first.flush_cache()
    with cached_engine(folder, path, block_size=16, context=256, sequences=1, threads=TINY_MODEL_THREADS) as second:
        result = second.generate(GenerationRequest((*PROMPT, 90), GREEDY)).wait()
    assert result.stats.reuse_tier is ReuseTier.DISK
    assert result.stats.reused_tokens >= 48
    assert result.token_ids == expected


def test_a_window_cache_is_full_size_on_the_device(tmp_path: Path) -> None:
    """A smaller one leaves the cells of a restored sequence where a cold run has others (loading.py)."""
    path = write_tiny_gemma3(tmp_path / "tiny.gguf")
    config = EngineConfig(model_path=path, context_cap=512, sequences=1, threads=TINY_MODEL_THREADS, swa_full=False)
    with Engine(config) as engine:
        assert engine.info.window > 0
        assert engine.info.swa_full


def test_two_engines_on_the_device_take_turns(tmp_path: Path) -> None:
    """llama.cpp's Vulkan backend crashes when two contexts work from two threads at once: while one
    engine is held mid-answer (holding the device), the other's request waits for its turn, then both
    answer as each does alone."""
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    config = EngineConfig(model_path=path, context_cap=256, sequences=1, threads=TINY_MODEL_THREADS)
    request = GenerationRequest(PROMPT, GREEDY, use_cache=False)
    with Engine(config) as first, Engine(config) as second:
        alone = first.generate(request).wait().token_ids
        with first.holding(Step.TOKEN, after=2) as gate:
            held = first.generate(request)
            assert gate.wait_until_holding()
            waiting = second.generate(request)
            deadline = time.monotonic() + 120
            while DEVICE.waiting < 1:  # the second engine's thread reaches the turn and waits there
                assert time.monotonic() < deadline, "the second engine never waited for the device"
                time.sleep(0.001)
            assert not waiting.done
            gate.release()
            assert held.wait().token_ids == alone
        assert waiting.wait().token_ids == alone
