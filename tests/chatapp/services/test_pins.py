"""PinKeeper on a real cache and database: pins that end are swept, what a lasting pin holds stays
pinned, and a model keeps only so many pins that end (the oldest end first)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cache.prefix_cache import PrefixCache
from chatapp.services import pins as pins_module
from chatapp.services.pins import REQUEST_PIN, PinKeeper
from chatapp.store.database import open_database
from chatapp.store.pins import PinStore
from tests.cache.test_prefix_cache import TOKENS, open_cache, store_sequence

OTHER = [*TOKENS[:8], 300, 301, 302, 303, 304]  # shares TOKENS' first two blocks
THIRD = [*TOKENS[:4], 400, 401, 402, 403, 404]  # shares the first block


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[PrefixCache]:
    opened = open_cache(tmp_path / "kv")
    for tokens in (TOKENS, OTHER, THIRD):
        store_sequence(opened, tokens)
    yield opened
    opened.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PinStore]:
    connection = open_database(tmp_path / "chatapp.db")
    yield PinStore(connection)
    connection.close()


def pinned_starts(cache: PrefixCache) -> list[tuple[int, int]]:
    return sorted((info.start, info.tokens.size) for info in cache.index.entries.values() if info.pinned)


def test_a_sweep_ends_the_pins_whose_time_is_up_and_keeps_what_a_lasting_pin_holds(
    cache: PrefixCache, store: PinStore
) -> None:
    clock = Clock()
    keeper = PinKeeper(cache, store, clock)
    assert keeper.pin("persona", "lasting", OTHER) == 4
    assert keeper.pin(REQUEST_PIN, "five minutes", TOKENS, ttl_s=300) == 3
    clock.now += 299
    assert keeper.sweep() == 0
    clock.now += 1
    assert keeper.sweep() == 1
    assert [pin.label for pin in store.list()] == ["lasting"]
    assert pinned_starts(cache) == [(0, 4), (4, 4), (8, 4), (12, 1)], "the blocks OTHER holds stay pinned"


def test_past_the_limit_the_oldest_request_pin_ends(
    cache: PrefixCache, store: PinStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pins_module, "MAX_REQUEST_PINS", 2)
    clock = Clock()
    keeper = PinKeeper(cache, store, clock)
    for tokens in (TOKENS, OTHER, THIRD):
        clock.now += 1
        assert keeper.pin(REQUEST_PIN, str(tokens[-1]), tokens, ttl_s=3600) > 0
    assert [pin.tokens for pin in store.list()] == [tuple(OTHER), tuple(THIRD)]
    assert (8, 3) not in pinned_starts(cache), "TOKENS' own last block is no longer pinned"
    assert (8, 4) in pinned_starts(cache)
