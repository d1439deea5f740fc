"""Verdicts of the load-time probes, remembered per model file, build, CPU and settings.

A probe decodes a few short prompts (seconds on a large model on a CPU): its verdict is kept
in this process and in a small JSON file in the data folder, so a model is probed once per
setting, not at every load. A verdict is "" (no problem found) or the problem in one line.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from cache.atomic_file import replace_atomically

log = logging.getLogger(__name__)

_SEEN: dict[str, str] = {}  # verdicts this process found or read: a model loaded again is not probed again


def recall(key: str, memo: Path | None) -> str | None:
    """The verdict remembered under `key` (this process's, else the memo file's), or None."""
    if key in _SEEN:
        return _SEEN[key]
    return _read(memo).get(key)


def remember(key: str, verdict: str, memo: Path | None) -> None:
    """Keep `verdict` for this process and, where a memo file is given, for later ones."""
    _SEEN[key] = verdict
    if memo is None:
        return
    stored = _read(memo)
    if stored.get(key) == verdict:
        return
    try:
        memo.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        replace_atomically(memo, json.dumps({**stored, key: verdict}, indent=0, sort_keys=True), durable=False)
    except OSError as error:  # probed again next time
        log.warning("could not remember a probe's verdict: %s", error)


def _read(memo: Path | None) -> dict[str, str]:
    if memo is None:
        return {}
    try:
        data = json.loads(memo.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {key: value for key, value in data.items() if isinstance(value, str)} if isinstance(data, dict) else {}
