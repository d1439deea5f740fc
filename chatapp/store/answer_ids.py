"""The exact token ids of answers given over the API, found again by their text.

An API client sends a conversation back as text. Tokenizing an answer's text again can
split it differently from the tokens the model generated, and the prompt would then leave
the cached prefix at that answer. The server remembers, for each answer it gave, the ids
under a digest (the service makes it) of the model, the conversation before it and the
answer's text; a client that sends the same conversation back gets the same tokens, across
restarts too.

Kept in a small diskcache folder (LRU under a byte budget) that stores bytes only.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Sequence
from pathlib import Path

from cache.disk_tier import DISK_ERRORS, open_bytes_store

log = logging.getLogger(__name__)

BUDGET_BYTES = 64 << 20
ID_TYPE = "i"  # 32-bit token ids


class AnswerIdStore:
    """digest -> token ids, on disk; a failing disk only costs reuse, never an answer."""

    def __init__(self, directory: Path) -> None:
        self._store = open_bytes_store(directory, BUDGET_BYTES)

    def remember(self, digest: str, token_ids: Sequence[int]) -> None:
        try:
            self._store.set(digest, array(ID_TYPE, token_ids).tobytes())
        except DISK_ERRORS as error:
            log.warning("could not remember an answer's token ids: %s", error)

    def recall(self, digest: str) -> tuple[int, ...] | None:
        try:
            raw = self._store.get(digest)
        except DISK_ERRORS as error:
            log.warning("could not read an answer's token ids: %s", error)
            return None
        if not isinstance(raw, bytes) or len(raw) % array(ID_TYPE).itemsize:
            return None
        ids = array(ID_TYPE)
        ids.frombytes(raw)
        return tuple(ids)

    def close(self) -> None:
        self._store.close()
