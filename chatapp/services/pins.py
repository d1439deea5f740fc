"""Pins kept in step with the cache's blocks: made, ended, and the ones a request asks for.

A pin keeps a prefix's blocks out of eviction and TTL expiry. Pins overlap (a persona's and a
document's after it; a coding agent's system prompt and each later turn's conversation), so
ending one unpins only the blocks no other pin still holds. A pin a request asked for
(Anthropic's `cache_control`) ends by itself: `sweep` ends those whose time is up, in this
process or, for pins made before a restart, the next one that opens the same model's cache.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cache.prefix_cache import PrefixCache
from chatapp.records import PinRecord
from chatapp.store.pins import PinStore

log = logging.getLogger(__name__)

REQUEST_PIN = "request"  # the kind of a pin a request asked for
SWEEP_EVERY_S = 30.0  # how often a server ends the request pins whose time is up
MAX_REQUEST_PINS = 32  # pins that end, per model: the oldest end first past this


class PinKeeper:
    """One model's pins: its cache's blocks and the list that names them (call off the UI thread)."""

    def __init__(self, cache: PrefixCache, store: PinStore, clock: Callable[[], float] = time.time) -> None:
        self.cache = cache
        self.store = store
        self.namespace = cache.namespace.id
        self._clock = clock

    def pin(self, kind: str, label: str, tokens: Sequence[int], ttl_s: float | None = None) -> int:
        """Pin the stored blocks of `tokens` (for `ttl_s` seconds, else until unpinned); how many entries
        hold it (0: nothing of it is stored, and nothing is remembered)."""
        count = self.cache.pin(list(tokens))
        if count:
            expires_at = self._clock() + ttl_s if ttl_s is not None else None
            self.store.add(kind, label, list(tokens), expires_at=expires_at, namespace=self.namespace)
            if ttl_s is not None:
                self._end_oldest_beyond(MAX_REQUEST_PINS)
        return count

    def _end_oldest_beyond(self, limit: int) -> None:
        """Pins that end are a client's hints: past `limit` of them on this model, the oldest end now (a
        client cannot hold the cache's whole budget out of eviction)."""
        ending = [pin for pin in self.store.list(self.namespace) if pin.expires_at is not None]
        for pin in ending[: max(0, len(ending) - limit)]:
            self.unpin(pin)

    def unpin(self, pin: PinRecord) -> int:
        """End `pin`, leaving pinned what the other live pins of this model hold."""
        self.store.remove(pin.id)
        now = self._clock()
        others = [
            list(other.tokens)
            for other in self.store.list(self.namespace)
            if other.expires_at is None or other.expires_at > now
        ]
        return self.cache.pin(list(pin.tokens), pinned=False, keep=others)

    def sweep(self) -> int:
        """End this model's pins whose time is up; how many."""
        ended = self.store.expired(self._clock(), self.namespace)
        for pin in ended:
            self.unpin(pin)
        return len(ended)


def describe_pin(pin: PinRecord) -> str:
    """One line for a list of pins: what it holds, how long, and until when if it ends."""
    until = f", until {time.strftime('%H:%M', time.localtime(pin.expires_at))}" if pin.expires_at is not None else ""
    return f"{pin.kind}: {pin.label} ({len(pin.tokens):,} tokens{until})"


@dataclass(frozen=True)
class PinAsked:
    """A prefix a request asked to keep: its tokens, for how long, and how to name it."""

    tokens: tuple[int, ...]
    ttl_s: float
    label: str


_SWEEP = PinAsked((), 0.0, "")  # nothing asked: only time to sweep


class RequestPins:
    """Pins requests ask for, made on a thread of their own once the engine has stored the prompt
    (after the answer: a pin holds stored blocks), and ended when their time is up."""

    def __init__(self, keeper: PinKeeper, flush: Callable[[], None], sweep_every_s: float = SWEEP_EVERY_S) -> None:
        self.keeper = keeper
        self._flush = flush
        self._sweep_every_s = sweep_every_s
        self._asked: queue.Queue[PinAsked | None] = queue.Queue()
        self._idle = threading.Condition()
        self._busy = 0
        self._thread = threading.Thread(target=self._run, name="chatapp-request-pins", daemon=True)
        self._thread.start()

    def ask(self, asked: Sequence[PinAsked]) -> None:
        """Pin these prefixes once the engine has stored them (now returns at once)."""
        with self._idle:
            self._busy += len(asked)
        for one in asked:
            self._asked.put(one)

    def wait(self) -> None:
        """Until every pin asked for so far is made (for tests and an orderly close)."""
        with self._idle:
            self._idle.wait_for(lambda: self._busy == 0)

    def close(self) -> None:
        self._asked.put(None)
        self._thread.join()

    def _run(self) -> None:
        next_sweep = 0.0
        while True:
            timeout = max(0.0, next_sweep - time.monotonic())
            try:
                asked = self._asked.get(timeout=timeout)
            except queue.Empty:
                asked = _SWEEP
            if asked is None:
                return
            try:
                if asked.tokens:
                    self._flush()
                    self.keeper.pin(REQUEST_PIN, asked.label, asked.tokens, asked.ttl_s)
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + self._sweep_every_s  # first: a sweep that fails waits too
                    self.keeper.sweep()
            except Exception:  # a pin is a hint: a failure costs a later miss, never the server
                log.warning("could not keep a prefix a request marked for keeping", exc_info=True)
            finally:
                if asked.tokens:
                    with self._idle:
                        self._busy -= 1
                        self._idle.notify_all()
