"""Calling a service from a screen: its one-line error becomes a notification, never a traceback."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from textual.widget import Widget

from chatapp.errors import ChatappError

T = TypeVar("T")


def attempt(node: Widget, operation: Callable[[], T], *, timeout: float = 10) -> T | None:
    """The operation's result, or None after telling the user why it failed (a locked database, say)."""
    try:
        return operation()
    except ChatappError as error:
        node.notify(str(error), severity="error", timeout=timeout)
        return None
