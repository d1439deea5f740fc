"""Durations as Ollama takes them (`keep_alive`, `--keep-alive`): seconds, or Go's "5m", "1h30m", "90s"."""

from __future__ import annotations

import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(-?)((?:\d+(?:\.\d*)?(?:ns|us|µs|ms|s|m|h))+)")
_PART = re.compile(r"(\d+(?:\.\d*)?)(ns|us|µs|ms|s|m|h)")


def duration_seconds(value: float | str) -> float | None:
    """Seconds; None for a negative value (Ollama's "until the server stops"). ValueError when unreadable."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text)
        except ValueError:
            match = _DURATION.fullmatch(text)
            if match is None:
                raise ValueError(
                    f"{text!r} is not a duration; give seconds or a duration such as 30s, 5m, 1h"
                ) from None
            seconds = sum(float(number) * _UNITS[unit] for number, unit in _PART.findall(match[2]))
            value = -seconds if match[1] else seconds
    return None if value < 0 else float(value)
