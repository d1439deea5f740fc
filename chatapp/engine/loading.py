"""Loading the model and its context, and the self-test that decides whether the cache may run.

The cache and the rewinds of an uncuttable sequence both rebuild llama.cpp's state bytes, so
before either is used the state format is checked on a few real tokens (cache/selftest.py);
when it fails the engine still answers, without a cache. Runs on the engine thread, which
owns the context from here on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from cache.llama_state import read_sequence_state, write_sequence_state
from cache.prefix_cache import PrefixCache
from cache.selftest import verify_layout
from cache.state_format import MemoryLayout, StateFormatError
from chatapp.engine.batch_rule import answer_batching, verdict_key, verdict_known
from chatapp.engine.batching import FLASH_ATTENTION_ROWS, GRID_TOKENS, MIN_ROWS
from chatapp.engine.config import CacheFactory, EngineConfig, LoadProgress, default_thread_count, split_progress
from chatapp.engine.device_turns import device_turn
from chatapp.engine.flash_choice import (
    FlashChoice,
    decided_flash,
    flash_key,
    measure_flash,
    recalled_flash,
    unmeasured_kind,
)
from chatapp.engine.llama_native import NativeContext, NativeModel, offload_device
from chatapp.engine.model_card import ModelInfo
from chatapp.engine.split_rule import fixed_batches
from chatapp.prompting.prompt import PromptBuilder

log = logging.getLogger(__name__)

ALL_LAYERS = 999
# Of a load's progress, the batching probe's when it runs (a model's first load in these settings:
# a few decodes per group size, seconds on a large model on a CPU); the weights have the rest.
PROBE_SHARE = 0.3
MEASURE_SHARE = 0.2  # flash attention's measurement, where `auto` runs it (flash_choice.py)
SELF_TEST_TEXT = "chatapp cache self-test: the quick brown fox"


@dataclass(frozen=True)
class LoadedModel:
    """The model, its context and what was learned loading them; the engine thread owns all of it."""

    model: NativeModel
    context: NativeContext
    info: ModelInfo
    prompt_builder: PromptBuilder
    layout: MemoryLayout | None  # None when the state format failed the self-test
    cache: PrefixCache | None
    cache_problem: str | None  # why there is no cache, in one line
    batch_answers: bool = False  # several requests' answer tokens share one decode (batch_rule.py)
    batch_problem: str | None = None  # why they do not, in one line

    @property
    def grid(self) -> int:
        """Prompts computed in fixed batches of this many tokens (0: batches end anywhere; split_rule.py)."""
        return self.info.prompt_grid

    @property
    def min_rows(self) -> int:
        """The fewest tokens in a prompt batch (see batching.py)."""
        return prompt_min_rows(self.model, self.context)

    def close(self) -> None:
        """Finish the cache's writes, then free the context and the model."""
        if self.cache is not None:
            self.cache.close()  # disk writes only: other engines keep the device meanwhile
        with device_turn():
            self.context.close()
            self.model.close()


def prompt_min_rows(model: NativeModel, context: NativeContext) -> int:
    """The fewest tokens in a prompt batch (see batching.py): more with flash attention (if it attends)."""
    attends = model.memory.has_blocks
    return FLASH_ATTENTION_ROWS if context.shape.flash_attention and attends else MIN_ROWS


def prompt_grid(config: EngineConfig, model: NativeModel, context: NativeContext, gpu_layers: int, key: str) -> int:
    """The fixed batch size prompts are computed in (0: none; split_rule.py logs why)."""
    if config.fixed_batches is False:
        return 0
    forced = config.fixed_batches is True
    rows = prompt_min_rows(model, context)
    if forced or fixed_batches(model, context, gpu_layers=gpu_layers, min_rows=rows, key=key, memo=config.batch_memo):
        return min(GRID_TOKENS, context.shape.n_batch)
    return 0


@dataclass(frozen=True)
class _Placement:
    """Where and how the model runs: its offloaded layers and device, threads, the window cache's size."""

    layers: int
    device: str | None
    threads: int
    swa_full: bool

    @classmethod
    def of(cls, config: EngineConfig) -> _Placement:
        layers, device = config.n_gpu_layers, offload_device()  # the registry asked once
        if layers < 0:
            layers = ALL_LAYERS if device is not None else 0  # a GPU build on a machine with a device
        # On a device a window cache smaller than the context leaves the cells of a restored or continued
        # sequence where a cold run has others, and its kernels round otherwise (measured on Vulkan with
        # flash attention): the full-size window cache there.
        return cls(layers, device, config.threads or default_thread_count(), config.swa_full or layers > 0)


def load_model(
    config: EngineConfig,
    cache_factory: CacheFactory | None,
    should_abort: Callable[[], bool],
) -> LoadedModel:
    """Load the weights and a context shaped by `config`, test the state format, open the cache.

    Each part that works on the device takes its own turn there (device_turns.py), so that another
    engine's answers go on between them while this one loads.
    """
    place = _Placement.of(config)
    flash_memo = flash_key(config.model_path, threads=place.threads, gpu_layers=place.layers, swa_full=place.swa_full)
    flash = decided_flash(
        config.flash_attention,
        kv_type=config.kv_type,
        serves_many=config.serves_many,
        batch_answers=config.batch_answers,
        sequences=config.sequences,
        model=config.model_path,
    ) or recalled_flash(flash_memo, config.batch_memo)
    key_of = partial(
        verdict_key,
        config.model_path,
        threads=place.threads,
        gpu_layers=place.layers,
        swa_full=place.swa_full,
        kv_type=config.kv_type,
    )
    # Whether the batching probe runs, for the progress bar's parts (with flash attention as remembered).
    probes = config.batch_answers and not verdict_known(
        key_of(sequences=config.sequences, flash_attention=flash is not None and flash.on), config.batch_memo
    )
    weights_progress, measure_progress, probe_progress = _progress_parts(config.load_progress, flash is None, probes)
    with device_turn():
        model = NativeModel(config.model_path, n_gpu_layers=place.layers, progress=weights_progress)
    try:
        flash = flash or unmeasured_kind(model.memory)
        if flash is None:
            with device_turn():
                flash = measure_flash(
                    model,
                    flash_memo,
                    config.batch_memo,
                    threads=place.threads,
                    n_batch=config.n_batch,
                    swa_full=place.swa_full,
                    progress=measure_progress,
                )
        context = _open_context(config, model, place, flash.on, should_abort)
    except BaseException:
        with device_turn():
            model.close()
        raise
    if context.shape.flash_attention != flash.on:
        flash = FlashChoice(context.shape.flash_attention, "this build has no flash attention for this model")
    info = _model_info(config, model, context, flash, place)
    try:
        return _checked_and_cached(
            config, model, context, info, partial(key_of, flash_attention=flash.on), probe_progress, cache_factory
        )
    except BaseException:
        with device_turn():
            context.close()
            model.close()
        raise


def _open_context(
    config: EngineConfig, model: NativeModel, place: _Placement, flash: bool, should_abort: Callable[[], bool]
) -> NativeContext:
    per_sequence = min(model.n_ctx_train or config.context_cap, config.context_cap)
    with device_turn():
        return NativeContext(
            model,
            n_sequences=config.sequences,
            n_ctx_per_sequence=per_sequence,
            n_threads=place.threads,
            n_batch=config.n_batch,
            flash_attention=flash,
            kv_type=config.kv_type,
            swa_full=place.swa_full,
            should_abort=should_abort,
        )


def _checked_and_cached(
    config: EngineConfig,
    model: NativeModel,
    context: NativeContext,
    info: ModelInfo,
    key_of: Callable[..., str],
    probe_progress: LoadProgress | None,
    cache_factory: CacheFactory | None,
) -> LoadedModel:
    """The state format's self-test, the batching and split probes (their verdicts remembered under
    `key_of(sequences=...)`), then the cache opened on the verified layout."""
    with device_turn():
        layout, problem = verify_state_format(model, context)
    batch: bool = False
    why_not: str | None = "turned off in the settings"
    if config.batch_answers:
        with device_turn():
            batch, why_not = answer_batching(
                model, context, info.gpu_layers, key_of(sequences=config.sequences), config.batch_memo, probe_progress
            )
    split_key = key_of(sequences=1)  # the split probe's verdict does not depend on the sequences
    with device_turn():
        info = replace(info, prompt_grid=prompt_grid(config, model, context, info.gpu_layers, split_key))
    if probe_progress is not None:
        probe_progress(1.0)  # the bar ends where a probe that found a difference early, or never ran, left it
    cache = cache_factory(layout, info) if cache_factory is not None and layout is not None else None
    builder = PromptBuilder.for_model(model)
    return LoadedModel(model, context, info, builder, layout, cache, problem, batch, why_not)


def _progress_parts(
    progress: LoadProgress | None, measures: bool, probes: bool
) -> tuple[LoadProgress | None, LoadProgress | None, LoadProgress | None]:
    """The load's progress bar in three parts: the weights, flash attention's measurement, the batching probe
    (each part that does not run has no share)."""
    weights_share = 1.0 - (MEASURE_SHARE if measures else 0.0) - (PROBE_SHARE if probes else 0.0)
    weights, rest = split_progress(progress, weights_share)
    measure_share = MEASURE_SHARE / (1.0 - weights_share) if measures else 0.0  # of the rest, when it has any
    measure, probe = split_progress(rest, measure_share)
    return weights, measure, probe


def _model_info(
    config: EngineConfig, model: NativeModel, context: NativeContext, flash: FlashChoice, place: _Placement
) -> ModelInfo:
    shape = context.shape
    return ModelInfo(
        path=config.model_path,
        name=model.metadata("general.name") or config.model_path.stem,
        description=model.description(),
        n_ctx_train=model.n_ctx_train,
        n_ctx_per_sequence=shape.n_ctx_per_sequence,
        n_sequences=shape.n_sequences,
        flash_attention=shape.flash_attention,
        flash_attention_why=flash.why,
        gpu_layers=min(place.layers, model.n_layer + 1),
        device=(place.device or "an unnamed device") if place.layers > 0 else "CPU",
        threads=place.threads,
        kv_type=shape.kv_type.value,
        memory_kind=model.memory.kind,
        window=model.window,
        swa_full=shape.swa_full,
        window_cells=shape.window_cells(model.window) if model.window > 0 else 0,
        n_vocab=model.n_vocab,
        facts=model.facts(),
    )


def verify_state_format(model: NativeModel, context: NativeContext) -> tuple[MemoryLayout | None, str | None]:
    """Verify the state format on a few real tokens: the layout, or None and why.

    Without a verified layout there is no cache, and no rewind of an uncuttable sequence.
    """
    probe = model.tokenize(SELF_TEST_TEXT, add_special=False, parse_special=False)
    source, target = 0, min(1, context.shape.n_sequences - 1)
    memory = model.memory
    try:
        batch = context.shape.n_batch
        for start in range(0, len(probe), batch):
            context.decode(probe[start : start + batch], start_pos=start, sequence=source, logits_for_last=False)
        state = read_sequence_state(context.pointer, source)
        partial = read_sequence_state(context.pointer, source, partial=True) if memory.restores_at_checkpoints else None
        context.remove(source, 0, -1)

        def restore_and_read_back(moved: np.ndarray) -> np.ndarray | None:
            if not write_sequence_state(context.pointer, target, moved):
                return None
            return read_sequence_state(context.pointer, target)

        return verify_layout(memory, state, partial, source, target, restore_and_read_back), None
    except (StateFormatError, RuntimeError) as error:
        problem = f"KV cache disabled: this llama.cpp's state format failed the self-test ({error})"
        log.warning(problem)
        return None, problem
    finally:
        context.remove(source, 0, -1)
        context.remove(target, 0, -1)
