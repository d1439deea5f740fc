"""Quantities as people read them, the same on every surface."""

from __future__ import annotations


def byte_size(count: int) -> str:
    """Bytes in binary units: 512 B, 93.8 MiB, 4.1 GiB."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def count_of(number: int, noun: str) -> str:
    """A count and its noun, plural but for one: 1 answer, 2,048 answers."""
    return f"{number:,} {noun}" + ("" if number == 1 else "s")
