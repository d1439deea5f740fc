"""Restore checks in the engine, on the bundled model: a reused prompt computed again in idle time, and a
damaged restore (a byte flipped after every checksum) caught, stopping reuse until the user resumes it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cache import llama_state
from cache.prefix_cache import STOPPED_NOTICE
from cache.restore_checks import RestoreChecks
from cache.state_format import parse_state
from chatapp.engine import kv_placement
from chatapp.engine.engine import Engine
from chatapp.engine.events import GenerationResult
from chatapp.engine.gate import Step
from chatapp.engine.llama_native import build_name
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.prompting.prompt import ChatMessage
from chatapp.services.cache_verify import resume_reuse
from chatapp.vocabulary import ReuseTier, Role
from tests.cache_support import cached_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)
PERSONA = "You are a patient tutor. You explain one idea at a time, with a short example. " * 3


def prompt(engine: Engine, question: str, persona: str = PERSONA) -> tuple[int, ...]:
    messages = [ChatMessage.of(Role.SYSTEM, persona), ChatMessage.of(Role.USER, question)]
    return tuple(engine.prompt_builder.build(messages))


def answer(engine: Engine, tokens: tuple[int, ...]) -> GenerationResult:
    return engine.generate(GenerationRequest(tokens, GREEDY)).wait()


def stored_and_pushed_out(engine: Engine, target: tuple[int, ...]) -> RestoreChecks:
    """`target` answered and stored, then pushed out of the one sequence by another conversation (and every
    check so far done); the engine's restore checks."""
    answer(engine, target)
    answer(engine, prompt(engine, "Tell me about rivers.", persona="You are a geographer."))
    engine.flush_cache(checks=True)
    assert engine.cache is not None
    return engine.cache.checks


def restored_from_ram(engine: Engine, target: tuple[int, ...]) -> GenerationResult:
    """`target` answered, pushed out of the one sequence, then answered again from RAM blocks."""
    stored_and_pushed_out(engine, target)
    warm = answer(engine, target)
    assert warm.stats.reuse_tier is ReuseTier.RAM
    return warm


@pytest.fixture
def checked(tmp_path: Path, model_path: Path) -> Iterator[Engine]:
    """Every reused prompt sampled; blocks assembled on every restore (no whole states kept)."""
    with cached_engine(tmp_path / "kv", model_path, sequences=1, ready_state_bytes=0, check_every=1) as engine:
        yield engine


def test_a_restored_answer_is_computed_again_in_idle_time_and_found_equal(checked: Engine) -> None:
    target = prompt(checked, "What is a verb?")
    restored_from_ram(checked, target)
    checked.flush_cache(checks=True)  # waits for the engine's own work: the check runs after the answer
    assert checked.cache is not None
    counts = checked.cache.checks.counts()
    assert counts.checked >= 1
    assert counts.equal == counts.checked
    assert counts.pending == 0
    assert not counts.suspended
    # The sequence holds the checked prompt as a cold run left it: asked again, it is reused in place.
    again = answer(checked, target)
    assert again.stats.reuse_tier is ReuseTier.DEVICE


def test_a_check_gives_way_to_a_request_and_waits_for_the_next_idle_time(checked: Engine) -> None:
    """A request waiting when the answer ends: the check does not start, and the prompt stays sampled; the
    engine checks it once it is idle again."""
    target = prompt(checked, "What is a noun?")
    checks = stored_and_pushed_out(checked, target)
    before = checks.counts()
    other = prompt(checked, "Name a colour.", persona="You answer in one word.")
    with checked.holding(Step.BATCH, 1, where=lambda request: request.prompt_tokens == target) as first:
        restoring = checked.generate(GenerationRequest(target, GREEDY))
        assert first.wait_until_holding()
        with checked.holding(Step.BATCH, 1, where=lambda request: request.prompt_tokens == other) as second:
            waiting = checked.generate(GenerationRequest(other, GREEDY))  # waits for the one sequence
            first.release()
            assert second.wait_until_holding()  # the restored answer and its own work are over
            assert restoring.wait().stats.reuse_tier is ReuseTier.RAM
            held = checks.counts()
            assert (held.checked, held.pending) == (before.checked, before.pending + 1)
    assert waiting.wait().stats.prompt_tokens == len(other)
    checked.flush_cache(checks=True)
    after = checks.counts()
    assert after.checked == before.checked + 1 == after.equal  # one check per idle time: the oldest sample
    assert all(sampled.tokens != target for sampled in checks.take(build_name()))


def test_a_damaged_restore_is_caught_and_stops_reuse_until_resumed(
    checked: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bits of the assembled state flipped after every checksum (the high bytes of the first cell's keys in
    the first layer, which every later token attends to): the restored answer's logits differ from a cold
    run's, the check says so, and reuse stops. (A flip may change nothing a later token computes, such as a
    value the attention weighs at zero: that restore is then exact, and a check rightly finds it equal.)"""
    target = prompt(checked, "What is an adjective?")
    load = llama_state.write_sequence_state

    def damaged(pointer: object, sequence: int, state: np.ndarray) -> bool:
        flipped = state.copy()
        base = parse_state(flipped, checked.model.memory).base
        assert base is not None
        base.keys[0][0, 1::2] ^= 0x40  # views into `flipped`
        return load(pointer, sequence, flipped)

    checks = stored_and_pushed_out(checked, target)
    before = checks.counts()
    monkeypatch.setattr(kv_placement, "write_sequence_state", damaged)
    warm = answer(checked, target)
    monkeypatch.undo()
    assert warm.stats.reuse_tier is ReuseTier.RAM
    checked.flush_cache(checks=True)  # the idle-time check
    counts = checks.counts()
    assert counts.mismatched == before.mismatched + 1
    assert counts.suspended
    assert "reused from ram answered unlike a cold run" in checks.mismatches()[-1].describe()
    assert checked.cache is not None
    assert checked.cache.take_notice() == STOPPED_NOTICE  # the app tells the user, once
    assert checked.cache.take_notice() is None
    stopped = answer(checked, target)  # computed in full, though every block is still there
    assert stopped.stats.reused_tokens == 0
    assert stopped.stats.reuse_tier is ReuseTier.NONE
    assert resume_reuse(tmp_path / "kv") == 1  # `chatapp cache verify --clear`, as from another process
    answer(checked, prompt(checked, "Tell me about rivers.", persona="You are a geographer."))
    resumed = answer(checked, target)
    assert resumed.stats.reuse_tier is ReuseTier.RAM
    checked.flush_cache(checks=True)
    assert not checks.suspended  # this restore was whole: its check found it equal
