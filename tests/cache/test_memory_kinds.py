"""Each memory kind's answers: what its states hold, where they may be cut, what a restore needs."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cache.memory_kinds import HybridMemory, MemoryKind, PlainMemory, RecurrentMemory, WindowMemory, memory_of
from tests.cache.state_factory import has_base, has_recurrent, has_window, needs_checkpoints

WINDOW = 4


def test_the_kind_llama_cpp_builds_is_named_by_its_properties() -> None:
    of = MemoryKind.of
    assert of(recurrent=False, hybrid=False, window=0) is MemoryKind.PLAIN
    assert of(recurrent=False, hybrid=False, window=512) is MemoryKind.ISWA
    assert of(recurrent=True, hybrid=False, window=0) is MemoryKind.RECURRENT
    assert of(recurrent=True, hybrid=True, window=0) is MemoryKind.HYBRID
    assert of(recurrent=True, hybrid=True, window=512) is MemoryKind.HYBRID_ISWA


@pytest.mark.parametrize("kind", list(MemoryKind), ids=lambda kind: kind.value)
def test_each_kind_is_one_class_that_answers_for_its_sections(kind: MemoryKind) -> None:
    memory = memory_of(kind, WINDOW)
    assert memory.kind is kind
    assert memory == memory_of(kind, WINDOW)  # chosen once, compared by value
    assert memory.has_blocks is has_base(kind)
    assert memory.restores_at_checkpoints is needs_checkpoints(kind)
    assert memory.updates_in_place is has_recurrent(kind)
    assert memory.checks_window_after_cut is has_window(kind)
    assert memory.window == (WINDOW if has_window(kind) else 0)
    assert memory.keeps_whole_states() is not needs_checkpoints(kind)


def test_a_hybrid_is_composed_of_an_attention_memory_and_a_recurrent_one() -> None:
    assert memory_of(MemoryKind.HYBRID) == HybridMemory(PlainMemory(), RecurrentMemory())
    windowed = memory_of(MemoryKind.HYBRID_ISWA, WINDOW)
    assert windowed == HybridMemory(WindowMemory(WINDOW))
    assert windowed.extends_checkpoint(10, 12) is WindowMemory(WINDOW).extends_checkpoint(10, 12) is True
    assert windowed.extends_checkpoint(10, 13) is False  # more than half a window behind


def test_only_a_plain_memory_or_a_window_still_whole_before_the_cut_cuts_in_place() -> None:
    def oldest_is(position: int) -> Callable[[], int]:
        return lambda: position

    assert PlainMemory().cuts_in_place(3, oldest_is(0))
    window = WindowMemory(WINDOW)
    assert window.cuts_in_place(10, oldest_is(6))  # the 4 cells before 10 are there
    assert not window.cuts_in_place(10, oldest_is(7))  # position 6 slid out
    assert not window.cuts_in_place(3, oldest_is(-1))  # the sequence holds nothing
    assert not WindowMemory(0).cuts_in_place(3, oldest_is(0))
    for memory in (RecurrentMemory(), HybridMemory(PlainMemory()), HybridMemory(window)):
        assert not memory.cuts_in_place(10, oldest_is(0))


def test_a_restored_window_starts_at_its_checkpoint_s_oldest_cell_and_no_earlier() -> None:
    """Cells before it are placeholders where a device writes them: the memory says where they end."""
    window = WindowMemory(WINDOW)
    assert window.restored_window_start(10) == 10 - WINDOW
    assert window.restored_window_start(WINDOW - 1) == 0  # the whole prefix is the window
    assert window.cuts_in_place(10, lambda: window.restored_window_start(10))  # at the end it holds
    assert not window.cuts_in_place(9, lambda: window.restored_window_start(10))  # behind it, never
    assert HybridMemory(window).restored_window_start(10) == window.restored_window_start(10)
    for memory in (PlainMemory(), RecurrentMemory(), HybridMemory(PlainMemory())):
        assert memory.restored_window_start(10) == 0


def test_checkpoints_are_deltas_only_where_a_window_slides() -> None:
    for memory in (PlainMemory(), RecurrentMemory(), HybridMemory(PlainMemory())):
        assert not memory.extends_checkpoint(10, 11)
    assert not WindowMemory(WINDOW).extends_checkpoint(10, 10)
