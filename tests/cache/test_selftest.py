"""The start-up self-test on synthetic states of every memory kind, with a fake llama.cpp."""

from __future__ import annotations

import numpy as np
import pytest

from cache.memory_kinds import MemoryKind, memory_of
from cache.selftest import verify_layout
from cache.state_format import StateFormatError
from tests.cache.state_factory import SyntheticModel, SyntheticSequence, has_base, needs_checkpoints, synthetic_model

ALL_KINDS = list(MemoryKind)


def model_of(kind: MemoryKind, v_trans: bool) -> SyntheticModel:
    return synthetic_model(kind, v_trans=v_trans, window=4)


def states(
    kind: MemoryKind, v_trans: bool = False, cells: int = 9
) -> tuple[SyntheticSequence, np.ndarray, np.ndarray | None]:
    sequence = SyntheticSequence(model_of(kind, v_trans), cells, seed=cells)
    state = np.frombuffer(sequence.state(cells, seq_id=0), dtype=np.uint8)
    partial = np.frombuffer(sequence.partial(cells), dtype=np.uint8) if needs_checkpoints(kind) else None
    return sequence, state, partial


class FakeContext:
    """Restores a state into the target sequence and reads back what it was given."""

    def __init__(self, answer: str = "same") -> None:
        self.answer = answer
        self.restored: list[bytes] = []

    def __call__(self, state: np.ndarray) -> np.ndarray | None:
        self.restored.append(state.tobytes())
        if self.answer == "refuse":
            return None
        if self.answer == "differ":
            changed = state.copy()
            changed[-1] ^= 1
            return changed
        return state.copy()


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("kind", ALL_KINDS, ids=[kind.value for kind in ALL_KINDS])
@pytest.mark.parametrize("cells", [3, 9])
def test_every_kind_passes_and_restores_into_the_target_sequence(kind: MemoryKind, v_trans: bool, cells: int) -> None:
    sequence, state, partial = states(kind, v_trans, cells)
    context = FakeContext()
    window = sequence.model.window
    assert verify_layout(memory_of(kind, window), state, partial, 0, 1, context) == sequence.model.layout
    assert context.restored == [sequence.state(cells, seq_id=1)]


@pytest.mark.parametrize("kind", ALL_KINDS[1:], ids=[kind.value for kind in ALL_KINDS[1:]])
@pytest.mark.parametrize("where", [-1, -5, 12])
def test_a_damaged_partial_state_fails(kind: MemoryKind, where: int) -> None:
    sequence, state, partial = states(kind)
    assert partial is not None
    if where > 0 and kind is MemoryKind.RECURRENT:
        where = 8  # the recurrent section's cell count: recurrent states have no KV cells
    damaged = partial.copy()
    damaged[where] ^= 0x10
    context = FakeContext()
    with pytest.raises(StateFormatError):
        verify_layout(memory_of(kind, sequence.model.window), state, damaged, 0, 1, context)
    assert context.restored == []  # refused before llama.cpp is asked
    with pytest.raises(StateFormatError, match="no partial state"):
        verify_layout(memory_of(kind, sequence.model.window), state, None, 0, 1, context)


def test_a_partial_state_of_another_position_fails() -> None:
    kind = MemoryKind.HYBRID_ISWA
    sequence, state, _ = states(kind)
    earlier = np.frombuffer(sequence.partial(8), dtype=np.uint8)
    with pytest.raises(StateFormatError, match="partial state differs"):
        verify_layout(memory_of(kind, sequence.model.window), state, earlier, 0, 1, FakeContext())


@pytest.mark.parametrize("kind", ALL_KINDS, ids=[kind.value for kind in ALL_KINDS])
@pytest.mark.parametrize(("answer", "message"), [("refuse", "refused"), ("differ", "reads back differently")])
def test_a_context_that_refuses_or_changes_the_state_fails(kind: MemoryKind, answer: str, message: str) -> None:
    sequence, state, partial = states(kind)
    with pytest.raises(StateFormatError, match=message):
        verify_layout(memory_of(kind, sequence.model.window), state, partial, 0, 1, FakeContext(answer))


@pytest.mark.parametrize("kind", ALL_KINDS, ids=[kind.value for kind in ALL_KINDS])
def test_too_short_or_unexpected_states_fail(kind: MemoryKind) -> None:
    sequence, state, partial = states(kind, cells=2)
    with pytest.raises(StateFormatError, match="at least 3 cells"):
        verify_layout(memory_of(kind, sequence.model.window), state, partial, 0, 1, FakeContext())
    sequence, state, partial = states(kind)
    shuffled = np.frombuffer(sequence.state(9, shuffle=True), dtype=np.uint8)
    if has_base(kind):  # cells out of order do not join back to the same bytes
        with pytest.raises(StateFormatError, match="differ from the original"):
            verify_layout(memory_of(kind, sequence.model.window), shuffled, partial, 0, 1, FakeContext())
    with pytest.raises(StateFormatError):
        verify_layout(memory_of(kind, sequence.model.window), state[:-1], partial, 0, 1, FakeContext())
