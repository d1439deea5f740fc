"""A small memo of the last few keys' values, shared by the threads that build prompts."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedMemo(Generic[K, V]):
    """The values of the `size` keys used last. The answer and warm-up workers build prompts at once: every
    call holds the memo's lock, and `get_or_make` makes a value once."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._keep(key, value)

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                value = make()
            self._keep(key, value)
            return value

    def _keep(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)
