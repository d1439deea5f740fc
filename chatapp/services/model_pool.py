"""Several models served by name, as Ollama serves them: each loaded by the first request that names it.

The model `chatapp serve` started with stays loaded. A request naming another model on this
machine (as `chatapp models` lists it) loads that one, while the others go on answering;
requests for a model being loaded wait for it. Models loaded so stay while they answer and
for `keep_alive` after (Ollama's setting, per request too), and the least recently used idle
ones are unloaded first when a new one would not fit in the memory budget or the count of
models kept together. Unloading writes the model's cache first: its prefixes come back from
RAM or disk when it is loaded again. Every model's cache entries live apart (the namespace
holds the model's fingerprint), so all of them share one data folder.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from chatapp.errors import ChatappError, ModelError
from chatapp.models.catalog import FoundModel, ModelCatalog
from chatapp.models.machine import check_found
from chatapp.services.machine_memory import fit_problem, machine_memory_bytes, memory_needed
from chatapp.services.model_list import found_card
from chatapp.services.serving import ModelCard, Serving

log = logging.getLogger(__name__)

DEFAULT_KEEP_ALIVE_S = 300.0  # Ollama's five minutes
LISTING_MAX_AGE_S = 10.0  # how long a look through the model folders is trusted
REAP_INTERVAL_S = 5.0
JUST_USED_S = 2.0  # a grace after a model was last used before it may be unloaded (no unload and reload in a burst)
UNCHANGED: Literal["unchanged"] = "unchanged"
KeepAlive = float | None | Literal["unchanged"]  # seconds; None: until the server stops; "unchanged": as it was


class ModelNotServed(ChatappError):
    """A request names a model that is not on this machine (HTTP 404)."""


class ModelRefused(ChatappError):
    """A request names a model that cannot be served: not a language model, parts missing, too large
    for the memory budget (HTTP 400: the client's choice, not the server's failure)."""


class ModelsBusy(ChatappError):
    """A model cannot be loaded until others finish answering (HTTP 503: retry)."""


@dataclass(frozen=True)
class PoolLimits:
    memory_bytes: int  # the model files loaded together, at most (the one started with counts too)
    max_loaded: int = 3  # Ollama's default on a CPU
    keep_alive_s: float | None = DEFAULT_KEEP_ALIVE_S  # idle time before unloading; None: never


@dataclass(frozen=True)
class ListedModel:
    name: str
    card: ModelCard
    loaded: bool


@dataclass
class _Loaded:
    name: str
    serving: Serving
    size_bytes: int
    last_used: float  # when last handed out or released; kept fresh while it answers
    keep_alive_s: float | None
    pinned: bool = False  # the model the server started with
    leases: int = 0  # requests handed this model that have not started on it yet

    def idle(self) -> bool:
        """Neither leased nor answering: it may be unloaded."""
        return self.leases == 0 and self.serving.completions.pending == 0


@dataclass
class _Loading:
    size_bytes: int  # counted against the limits while it loads
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class ModelPool:
    """The served models: the one started with, and any other found on the machine, loaded on demand."""

    def __init__(
        self,
        default: Serving,
        *,
        catalog: ModelCatalog | None = None,
        open_serving: Callable[[Path], Serving] | None = None,
        limits: PoolLimits | None = None,
        aliases: tuple[str, ...] = (),
        any_model: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.default = default
        self.aliases = aliases
        self.any_model = any_model
        self._catalog = catalog
        self._open_serving = open_serving
        self.limits = limits or PoolLimits(memory_bytes=1 << 62)
        self._clock = clock
        self._lock = threading.Lock()
        default_key = _key(Path(default.model.path)) if default.model.size_bytes else default.model.path
        self._default_key = default_key
        self._loaded: dict[str, _Loaded] = {
            default_key: _Loaded(default.model.id, default, default.model.size_bytes, clock(), None, pinned=True)
        }
        self._loading: dict[str, _Loading] = {}
        self._listing: tuple[float, list[FoundModel]] | None = None
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        if catalog is not None:
            self._reaper = threading.Thread(target=self._reap_until_closed, name="model-reaper", daemon=True)
            self._reaper.start()

    # -- names --------------------------------------------------------------------------------

    def default_names(self) -> list[str]:
        """The started model's names: its id, then its aliases."""
        return list(dict.fromkeys((self.default.model.id, *self.aliases)))

    def listed(self) -> list[ListedModel]:
        """What /v1/models and /api/tags list: the started model under each name, then every other model here."""
        with self._lock:
            loaded = dict(self._loaded)
        rows = [ListedModel(name, self.default.model, True) for name in self.default_names()]
        for found in self._found():
            key = _key(found.path)
            if key == self._default_key or not found.can_chat:
                continue
            held = loaded.get(key)
            rows.append(ListedModel(found.name, held.serving.model if held else found_card(found), held is not None))
        return rows

    def running(self) -> list[tuple[str, ModelCard, float | None]]:
        """What /api/ps lists: each loaded model, its card and the seconds until it is unloaded (None: never)."""
        now = self._clock()
        with self._lock:
            loaded = list(self._loaded.values())
        rows: list[tuple[str, ModelCard, float | None]] = []
        for held in loaded:
            name = self.default_names()[0] if held.pinned else held.name  # one row a model, not one an alias
            expires = None if held.keep_alive_s is None else max(0.0, held.last_used + held.keep_alive_s - now)
            rows.append((name, held.serving.model, expires))
        return rows

    def card(self, name: str) -> ModelCard:
        """What /api/show says of `name`, without loading it: the loaded model's card, else its header's
        (template included), as Ollama answers from the model's files."""
        found = self._resolve(name)
        key = self._default_key if found is None else _key(found.path)
        with self._lock:
            held = self._loaded.get(key)
        if held is not None or found is None:
            return held.serving.model if held is not None else self.default.model
        return found_card(found, with_template=True)

    def check(self, name: str) -> None:
        """ModelNotServed unless `name` is served here (loaded or not)."""
        self._resolve(name)

    # -- serving ------------------------------------------------------------------------------

    def acquire(self, name: str, keep_alive_s: KeepAlive = UNCHANGED) -> tuple[Serving, Callable[[], None]]:
        """The model `name` names, loaded first if need be (blocking: call it off the event loop), and
        the release to call once the request has started on it (or failed to): until then the model
        is leased and never unloaded; once started, its pending answer keeps it.

        `keep_alive_s`: how long it stays loaded once idle (None: until the server stops; 0:
        unloaded when idle); "unchanged" keeps what it had.
        """
        found = self._resolve(name)
        key = self._default_key if found is None else _key(found.path)
        while True:
            with self._lock:
                if self._stop.is_set():
                    raise ModelsBusy("the server is stopping; retry against its next start")
                if key in self._loaded:
                    return self._lease_locked(key, keep_alive_s)
                loading = self._loading.get(key)
                if loading is None and found is not None:
                    loading = self._loading[key] = _Loading(size_bytes=found.size_bytes)
                    break
            if loading is None:  # the started model, gone: the server is stopping
                raise ModelsBusy("the server is stopping; retry against its next start")
            loading.done.wait()
            if loading.error is not None:
                raise loading.error
        assert found is not None
        try:
            serving = self._load(found)
        except BaseException as error:
            loading.error = error
            with self._lock:
                self._loading.pop(key, None)
            loading.done.set()
            raise
        with self._lock:
            self._loading.pop(key, None)
            stopped = self._stop.is_set()
            if not stopped:
                keep = self.limits.keep_alive_s if keep_alive_s == UNCHANGED else keep_alive_s
                self._loaded[key] = _Loaded(found.name, serving, found.size_bytes, self._clock(), _seconds(keep))
                leased = self._lease_locked(key, UNCHANGED)
        loading.done.set()
        if stopped:  # closed while it loaded: nobody will close it later
            self._close(_Loaded(found.name, serving, found.size_bytes, 0.0, None))
            raise ModelsBusy("the server is stopping; retry against its next start")
        return leased

    def _lease_locked(self, key: str, keep_alive_s: KeepAlive) -> tuple[Serving, Callable[[], None]]:
        held = self._loaded[key]
        held.leases += 1
        held.last_used = self._clock()
        if keep_alive_s != UNCHANGED and not held.pinned:
            held.keep_alive_s = _seconds(keep_alive_s)
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if not released:
                    released = True
                    held.leases -= 1
                    held.last_used = self._clock()

        return held.serving, release

    def unload(self, name: str) -> bool:
        """Unload the model `name` names once it is idle (Ollama's keep_alive 0); the started model stays."""
        found = self._resolve(name)
        if found is None:
            return False
        with self._lock:
            held = self._loaded.get(_key(found.path))
            if held is None:
                return False
            held.keep_alive_s = 0.0
        self.reap()
        return True

    def reap(self) -> None:
        """Unload the models idle past their keep-alive (their caches written first)."""
        now = self._clock()
        with self._lock:
            for held in self._loaded.values():
                if not held.idle():
                    held.last_used = now  # keep-alive counts from the end of its last answer, as Ollama's
            expired = [
                key
                for key, held in self._loaded.items()
                if not held.pinned
                and held.keep_alive_s is not None
                and now >= held.last_used + max(held.keep_alive_s, JUST_USED_S)
                and held.idle()
            ]
            closing = [self._loaded.pop(key) for key in expired]
        for held in closing:
            self._close(held)

    def close(self) -> None:
        """Stop unloading, then close every model but the started one (its owner closes it)."""
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join(timeout=REAP_INTERVAL_S * 2)
        with self._lock:
            others = [held for held in self._loaded.values() if not held.pinned]
            self._loaded = {key: held for key, held in self._loaded.items() if held.pinned}
        for held in others:
            self._close(held)

    # -- inside -------------------------------------------------------------------------------

    def _resolve(self, name: str) -> FoundModel | None:
        """The model `name` names; None for the started model; ModelNotServed for none."""
        bare = name.strip()
        names = self.default_names()
        if bare.removesuffix(":latest") in names or bare == f"{names[0]}.gguf":
            return None
        found = self._find(bare)
        if found is not None:
            return None if _key(found.path) == self._default_key else found
        if self.any_model:
            return None
        listed = [row.name for row in self.listed()]
        raise ModelNotServed(
            f"model {name!r} is not served here; this server serves {', '.join(map(repr, listed[:6]))}"
            f"{', ...' if len(listed) > 6 else ''} (see GET /v1/models)"
        )

    def _find(self, name: str) -> FoundModel | None:
        """The model listed under `name`: Ollama's clients add `:latest` to a name without a tag, as
        /api/tags lists it, and leave it out for `:latest` models."""
        wanted = name.lower()
        for found in self._found():
            candidate = found.name.lower()
            if candidate in (wanted, f"{wanted}:latest", wanted.removesuffix(":latest")):
                return found
        return None

    def _found(self) -> list[FoundModel]:
        """The models on the machine as last looked up: the folders are looked through again by the
        reaper's thread, never on a request's way (the first look aside)."""
        with self._lock:
            listing = self._listing
        return listing[1] if listing is not None else self._refresh_listing()

    def _refresh_listing(self) -> list[FoundModel]:
        models = self._catalog.models() if self._catalog is not None else []
        with self._lock:
            self._listing = (time.monotonic(), models)
        return models

    def _load(self, found: FoundModel) -> Serving:
        if self._open_serving is None:
            raise ModelNotServed(f"model {found.name!r} is not served here")
        try:
            path = check_found(found)
        except ModelError as error:
            raise ModelRefused(str(error)) from None
        if memory_needed(found.size_bytes) > self.limits.memory_bytes:
            raise ModelRefused(
                f"model {found.name} (about {_gib(memory_needed(found.size_bytes))} loaded) is larger than the "
                f"{_gib(self.limits.memory_bytes)} this server loads models into; raise --models-memory or pick "
                "a smaller quantization"
            )
        self._make_room(found)
        log.info("loading %s from %s", found.name, path)
        try:
            return self._open_serving(path)
        except ChatappError as error:
            raise ModelError(f"model {found.name} failed to load: {error}") from None

    def _make_room(self, found: FoundModel) -> None:
        """Unload idle models, least recently used first, until `found` fits beside the rest."""
        while True:
            with self._lock:
                held = list(self._loaded.values())
                others_loading = [loading for key, loading in self._loading.items() if key != _key(found.path)]
                used = sum(model.size_bytes for model in held) + sum(loading.size_bytes for loading in others_loading)
                count = len(held) + len(others_loading)
                problem = fit_problem(found.size_bytes, held_bytes=used, budget_bytes=self.limits.memory_bytes)
                if not problem and count < self.limits.max_loaded:
                    return
                now = self._clock()
                idle = [
                    model
                    for model in held
                    if not model.pinned and model.idle() and now - model.last_used >= JUST_USED_S
                ]
                if not idle:
                    raise ModelsBusy(
                        f"model {found.name} does not fit beside the models answering now ({count} loaded or "
                        f"loading; {problem or 'at most ' + str(self.limits.max_loaded)}); retry shortly"
                    )
                victim = min(idle, key=lambda model: model.last_used)
                key = next(key for key, model in self._loaded.items() if model is victim)
                del self._loaded[key]
            log.info("unloading %s to make room for %s", victim.name, found.name)
            self._close(victim)

    def _close(self, held: _Loaded) -> None:
        try:
            held.serving.close()
        except Exception:
            log.exception("closing %s failed", held.name)

    def _reap_until_closed(self) -> None:
        while not self._stop.wait(REAP_INTERVAL_S):
            try:
                self.reap()
                with self._lock:
                    listing = self._listing
                if listing is None or time.monotonic() - listing[0] > LISTING_MAX_AGE_S:
                    self._refresh_listing()
            except Exception:
                log.exception("unloading idle models failed")


def default_memory_budget() -> int:
    """Three quarters of the machine's memory for model files loaded together (room left for their contexts)."""
    memory = machine_memory_bytes()
    return memory * 3 // 4 if memory else 16 << 30


def _key(path: Path) -> str:
    try:
        return str(path.resolve())
    except OSError:
        return str(path)


def _seconds(keep_alive_s: KeepAlive) -> float | None:
    if keep_alive_s is None or isinstance(keep_alive_s, str):
        return None
    return None if keep_alive_s < 0 else float(keep_alive_s)


def _gib(count: int) -> str:
    return f"{count / (1 << 30):.1f} GiB"
