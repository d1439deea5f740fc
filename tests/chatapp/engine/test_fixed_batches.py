"""Prompts on a fixed grid of batches, forced on the bundled model: what models whose KV depends on
where batches end (Gemma 3 on this CPU, any GPU) do, checked where every path can run quickly.

Each warm answer is compared with the same prompt computed cold by the same engine settings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.engine.batching import GRID_TOKENS, on_grid
from chatapp.engine.engine import Engine
from chatapp.engine.events import GenerationResult
from chatapp.engine.kv_placement import FRESH_TOKENS
from chatapp.engine.llama_native import NativeContext
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import Role
from tests.cache_support import cached_engine

# Answers run to their limit, so that one crosses a grid point (its whole batches are then reused).
LONG = SamplingParams(temperature=0.0, max_tokens=70, ignore_eos=True)
SHORT = SamplingParams(temperature=0.0, max_tokens=8)
PERSONA = "You are a careful librarian. You answer in two sentences and cite the shelf. " * 8


def gridded(folder: Path, model_path: Path) -> Engine:
    return cached_engine(folder, model_path, block_size=GRID_TOKENS, fixed_batches=True)


def turn(
    engine: Engine, tokens: tuple[int, ...], sampling: SamplingParams, *, use_cache: bool = True
) -> GenerationResult:
    return engine.generate(GenerationRequest(tokens, sampling, use_cache=use_cache)).wait()


def first_turn(engine: Engine) -> list[ChatMessage]:
    return [ChatMessage.of(Role.SYSTEM, PERSONA), ChatMessage.of(Role.USER, "Where are the atlases kept?")]


def test_the_grid_is_reported_and_batches_are_whole_grid_batches(tmp_path: Path, model_path: Path) -> None:
    with gridded(tmp_path, model_path) as engine:
        assert engine.info.prompt_grid == GRID_TOKENS
        prompt = tuple(engine.prompt_builder.build(first_turn(engine)))
        assert len(prompt) > 2 * GRID_TOKENS
        turn(engine, prompt, SHORT)
        again = turn(engine, prompt, SHORT)
        # Every token but the fresh two is resident, but only whole grid batches are reused.
        assert again.stats.reuse_tier == "device"
        assert again.stats.reused_tokens == on_grid(len(prompt) - FRESH_TOKENS, GRID_TOKENS)


@pytest.mark.parametrize("reads_first", [True, False], ids=["after the recompute", "sent at once"])
def test_a_next_turn_in_place_reuses_the_whole_batches_it_has_and_answers_as_cold(
    tmp_path: Path, model_path: Path, reads_first: bool
) -> None:
    with gridded(tmp_path, model_path) as engine:
        messages = first_turn(engine)
        prompt = tuple(engine.prompt_builder.build(messages))
        first = turn(engine, prompt, LONG)
        assert len(first.token_ids) == LONG.max_tokens
        if reads_first:
            engine.flush_cache()  # the user reads the answer: its tokens are computed again meanwhile
        messages += [
            ChatMessage(role=Role.ASSISTANT, parts=(first.text,), generated_ids=first.token_ids),
            ChatMessage.of(Role.USER, "And the maps?"),
        ]
        follow_up = tuple(engine.prompt_builder.build(messages))
        warm = turn(engine, follow_up, SHORT)
        cold = turn(engine, follow_up, SHORT, use_cache=False)
        assert warm.stats.reuse_tier == "device"
        if reads_first:
            # Recomputed in whole grid batches: reused up to the last grid point the answer reaches.
            assert warm.stats.reused_tokens == on_grid(len(prompt) + LONG.max_tokens - 1, GRID_TOKENS)
            assert warm.stats.reused_tokens > on_grid(len(prompt), GRID_TOKENS)
        else:
            # The follow-up came first: the answer's own tokens (one at a time) are not reused, only
            # what the recompute redid in whole grid batches before it stopped, if anything.
            assert on_grid(len(prompt), GRID_TOKENS) <= warm.stats.reused_tokens
            assert warm.stats.reused_tokens <= on_grid(len(prompt) + LONG.max_tokens - 1, GRID_TOKENS)
            assert warm.stats.reused_tokens % GRID_TOKENS == 0
        assert warm.token_ids == cold.token_ids


def test_the_cache_keeps_whole_grid_batches_and_a_restart_restores_them_as_cold(
    tmp_path: Path, model_path: Path
) -> None:
    with gridded(tmp_path, model_path) as first:
        prompt = tuple(first.prompt_builder.build(first_turn(first)))
        turn(first, prompt, LONG)
        cold = turn(first, prompt, SHORT, use_cache=False)
    with gridded(tmp_path, model_path) as second:
        warm = turn(second, prompt, SHORT)
    assert warm.stats.reuse_tier == "disk"
    assert warm.stats.reused_tokens == on_grid(len(prompt) - FRESH_TOKENS, GRID_TOKENS)
    assert warm.token_ids == cold.token_ids


@pytest.mark.parametrize("cut", [5, 70])
def test_a_prompt_that_leaves_a_stored_one_inside_a_grid_batch_restores_only_the_whole_batches_before(
    tmp_path: Path, model_path: Path, cut: int
) -> None:
    with gridded(tmp_path, model_path) as engine:
        prompt = tuple(engine.prompt_builder.build(first_turn(engine)))
        turn(engine, prompt, SHORT)
        engine.flush_cache()
        other = prompt[: len(prompt) - cut] + tuple(engine.tokenize(" Something else entirely, please."))
        for sequence_filler in ("Tell me about rivers.", "Tell me about mountains."):  # push it out of the context
            filler = [ChatMessage.of(Role.SYSTEM, "You are a geographer."), ChatMessage.of(Role.USER, sequence_filler)]
            turn(engine, tuple(engine.prompt_builder.build(filler)), SHORT)
        warm = turn(engine, other, SHORT)
        cold = turn(engine, other, SHORT, use_cache=False)
    shared = next(index for index, (a, b) in enumerate(zip(prompt, other, strict=False)) if a != b)
    assert shared >= len(prompt) - cut
    assert warm.stats.reuse_tier == "ram"
    assert warm.stats.reused_tokens == on_grid(shared, GRID_TOKENS)
    assert warm.token_ids == cold.token_ids


def test_every_prompt_batch_starts_on_a_grid_point_and_stops_at_the_next(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with gridded(tmp_path, model_path) as engine:
        batches: list[tuple[int, int]] = []
        real = NativeContext.decode

        def noted(
            self: NativeContext, tokens: list[int], *, start_pos: int, sequence: int, logits_for_last: bool
        ) -> None:
            if len(tokens) > 1:
                batches.append((start_pos, len(tokens)))
            real(self, tokens, start_pos=start_pos, sequence=sequence, logits_for_last=logits_for_last)

        monkeypatch.setattr(NativeContext, "decode", noted)
        messages = first_turn(engine)
        first = turn(engine, tuple(engine.prompt_builder.build(messages)), LONG)
        engine.flush_cache()  # the answer computed again in batches
        messages += [
            ChatMessage(role=Role.ASSISTANT, parts=(first.text,), generated_ids=first.token_ids),
            ChatMessage.of(Role.USER, "And the maps?"),
        ]
        turn(engine, tuple(engine.prompt_builder.build(messages)), SHORT)
    assert len(batches) >= 5  # two prompts of several grid batches, and the recompute
    for start, length in batches:
        assert start % GRID_TOKENS == 0, batches
        assert length <= GRID_TOKENS, batches
