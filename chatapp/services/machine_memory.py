"""How much memory this machine has, and how much is free now: what decides whether a model fits."""

from __future__ import annotations

import os
from pathlib import Path

from chatapp.services.units import byte_size

MEMINFO = Path("/proc/meminfo")


def machine_memory_bytes() -> int:
    """Physical memory (0 where the system does not say)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


def available_memory_bytes() -> int:
    """Memory a new model can take now without pushing others out: Linux's MemAvailable (page cache
    that can be dropped counts as free), else the free pages; 0 where the system does not say."""
    try:
        for line in MEMINFO.read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


# A model takes about its file's size (the weights) and a little more: its context and the cache's RAM tier.
MEMORY_MARGIN = 1.1


def memory_needed(size_bytes: int) -> int:
    """What loading a model of `size_bytes` takes, by the one rule the chat screen and the server share."""
    return int(size_bytes * MEMORY_MARGIN)


def fit_problem(size_bytes: int, *, held_bytes: int = 0, budget_bytes: int = 0, free_bytes: int | None = None) -> str:
    """Why a model of `size_bytes` would not fit ("" when it would): more than the memory free now
    (`free_bytes`, measured when not given), or, with a budget for the models loaded together, more
    than what is left of it beside those holding `held_bytes`."""
    needed = memory_needed(size_bytes)
    if budget_bytes and needed + memory_needed(held_bytes) > budget_bytes:
        left = max(0, budget_bytes - memory_needed(held_bytes))
        return f"needs about {byte_size(needed)}, {byte_size(left)} of the {byte_size(budget_bytes)} budget left"
    free = available_memory_bytes() if free_bytes is None else free_bytes
    if free and needed > free:
        return f"needs about {byte_size(needed)}, {byte_size(free)} free now"
    return ""
