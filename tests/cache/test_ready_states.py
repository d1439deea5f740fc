"""Whole states kept ready to load: the shortest fitting one, prefixes superseded, a byte budget."""

from __future__ import annotations

import numpy as np

from cache.eviction import LruPolicy
from cache.ram_tier import RamTier
from cache.ready_states import ReadyStates


def tokens(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int32)


def state(size: int, fill: int = 0) -> np.ndarray:
    return np.full(size, fill, dtype=np.uint8)


def test_a_state_is_found_by_the_tokens_it_shares_with_a_prompt() -> None:
    ready = ReadyStates(1000)
    ready.keep(tokens(1, 2, 3, 4), state(10, 1))
    found = ready.best(tokens(1, 2, 3, 9, 9), 3)
    assert found is not None
    assert found.state[0] == 1
    assert ready.best(tokens(1, 5, 3, 4), 3) is None  # differs inside the reused part
    assert ready.best(tokens(1, 2), 2) is None  # would load twice what is reused: assemble instead
    assert ready.best(tokens(1, 2, 3, 4, 5, 6), 5) is None  # holds less than is reused


def test_the_shortest_fitting_state_is_chosen() -> None:
    ready = ReadyStates(1000)
    ready.keep(tokens(1, 2, 3, 4, 5, 6), state(10, 1))
    ready.keep(tokens(1, 2, 3, 4, 7), state(10, 2))
    found = ready.best(tokens(1, 2, 3, 4, 8), 4)
    assert found is not None
    assert found.state[0] == 2


def test_a_longer_state_supersedes_its_prefix() -> None:
    ready = ReadyStates(1000)
    ready.keep(tokens(1, 2, 3), state(10, 1))
    ready.keep(tokens(1, 2, 3, 4), state(12, 2))
    assert ready.bytes_used == 12
    found = ready.best(tokens(1, 2, 3, 4), 3)
    assert found is not None
    assert found.state[0] == 2


def test_the_least_recently_used_go_past_the_budget() -> None:
    ready = ReadyStates(25)
    ready.keep(tokens(1, 1), state(10, 1))
    ready.keep(tokens(2, 2), state(10, 2))
    found = ready.best(tokens(1, 1), 2)
    assert found is not None
    ready.used(found)  # now the most recently used
    ready.keep(tokens(3, 3), state(10, 3))
    assert ready.bytes_used == 20
    assert ready.best(tokens(2, 2), 2) is None
    assert ready.best(tokens(1, 1), 2) is not None
    ready.keep(tokens(4, 4), state(30, 4))  # larger than the whole budget: not kept
    assert ready.best(tokens(4, 4), 2) is None


def test_kept_tokens_are_a_copy() -> None:
    ready = ReadyStates(100)
    held = tokens(1, 2, 3)
    ready.keep(held, state(5))
    held[0] = 9
    assert ready.best(tokens(1, 2, 3), 3) is not None


def test_a_state_larger_than_the_budget_is_kept_as_one_ram_entry_under_ram_budget() -> None:
    """Past its own budget a state is RAM's entry (counted, evicted and dropped there), not a second copy."""
    ram = RamTier(budget_bytes=250, ttl_seconds=3600, policy=LruPolicy())
    ready = ReadyStates(100, ram)
    assert not ready.keeps_whole(100)
    assert ready.keeps_whole(101)
    assert not ready.keeps_whole(251)  # larger than RAM: blocks go to disk only, nothing kept whole
    large = state(200, 7)
    ready.keep(tokens(1, 2, 3, 4), large)
    assert (ram.bytes_used, ready.bytes_used) == (200, 0)
    found = ready.best(tokens(1, 2, 3, 4, 9), 4)
    assert found is not None
    assert np.shares_memory(found.state, large)  # the memory read, not a copy
    assert not found.state.flags.writeable
    ready.drop_superseded(tokens(1, 2, 3, 4, 5))
    assert ram.bytes_used == 0  # let go before a longer state is read: never both at once
    assert ready.best(tokens(1, 2, 3, 4, 9), 4) is None
    ready.keep(tokens(1, 2, 3), state(150, 1))
    ready.keep(tokens(5, 6, 7), state(150, 2))  # RAM evicts the older one
    assert ready.best(tokens(1, 2, 3), 3) is None
    found = ready.best(tokens(5, 6, 7), 3)
    assert found is not None
    assert found.state[0] == 2
    ready.keep(tokens(5, 6, 7, 8), state(251))  # too large for RAM: not kept, and nothing it superseded lost
    assert ready.best(tokens(5, 6, 7), 3) is not None
    ready.clear()
    assert ram.bytes_used == 0


def test_without_a_budget_nothing_is_kept_whole_not_even_in_ram() -> None:
    """A model whose states cannot be cut after a load (windows, recurrent states) keeps no whole states."""
    ram = RamTier(budget_bytes=1000, ttl_seconds=3600)
    ready = ReadyStates(0, ram)
    assert not ready.keeps_whole(500)
    ready.keep(tokens(1, 2), state(500))
    assert ram.bytes_used == 0


def test_forgetting_drops_the_states_that_hold_deleted_tokens_and_keeps_the_shared_ones() -> None:
    """A deleted conversation's states go, the large one from RAM too; a state of a kept conversation that
    shares the deleted one's persona stays, as does one that merely begins like it."""
    ram = RamTier(budget_bytes=1000, ttl_seconds=3600, policy=LruPolicy())
    ready = ReadyStates(130, ram)
    persona = (1, 2, 3)
    ready.keep(tokens(*persona, 10, 11, 12), state(50, 1))  # the deleted conversation, then an answer
    ready.keep(tokens(*persona, 10, 11, 13, 14), state(200, 2))  # the deleted conversation's other branch (RAM)
    ready.keep(tokens(*persona, 20, 21), state(40, 3))  # a kept conversation on the same persona
    ready.keep(tokens(*persona, 30), state(30, 4))  # another kept conversation
    deleted = [tokens(*persona, 10, 11, 12, 99)]
    kept = [tokens(*persona, 20, 21, 22)]
    assert ready.forget(deleted, kept) == 2
    assert ram.bytes_used == 0
    assert ready.best(tokens(*persona, 10, 11), 5) is None
    assert ready.best(tokens(*persona, 20, 21), 5) is not None
    assert ready.best(tokens(*persona, 30), 4) is not None  # shares only the persona with the deleted one
    assert ready.forget(deleted, kept) == 0
