"""Quantities as people read them (chatapp/services/units.py), the same on every surface."""

from __future__ import annotations

from chatapp.services.units import byte_size, count_of


def test_sizes_are_written_for_people() -> None:
    assert byte_size(512) == "512 B"
    assert byte_size(3 * 1024 * 1024) == "3.0 MiB"
    assert byte_size(5 * 1024**3) == "5.0 GiB"
    assert byte_size(3 * 1024**4) == "3.0 TiB"


def test_counts_are_plural_but_for_one() -> None:
    assert count_of(1, "answer") == "1 answer"
    assert count_of(0, "answer") == "0 answers"
    assert count_of(2048, "answer") == "2,048 answers"
