"""Ollama's `keep_alive` on a request: how long its model stays loaded after it, as Ollama reads it."""

from __future__ import annotations

from chatapp.server.errors import ApiError
from chatapp.services.durations import duration_seconds
from chatapp.services.model_pool import UNCHANGED, KeepAlive


def keep_alive_seconds(value: float | str | None) -> KeepAlive:
    """Seconds to stay loaded once idle (None: until the server stops; 0: unload once idle), or UNCHANGED."""
    if value is None:
        return UNCHANGED
    try:
        return duration_seconds(value)
    except ValueError as error:
        raise ApiError(400, f"keep_alive: {error}", param="keep_alive") from None
