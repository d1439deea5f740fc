"""The offload path: every layer on a device (a GPU, or Mesa's llvmpipe through Vulkan), the KV cells
and the states restored there.

These need a llama.cpp built for a device. On a CPU build they are skipped, and the summary says
why; `make test-vulkan` builds llama.cpp with Vulkan and runs them, with the memory-kind, property
and batching tests (marked `device`), on llvmpipe where the machine has no GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.engine.engine import Engine, EngineConfig
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
