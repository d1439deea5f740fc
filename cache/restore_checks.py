"""Restores checked in the field: a sample of the prompts the cache served, computed again without it.

A restore is meant to be bit-identical to a cold run, and the tests prove it on the models and
machines the project has; this proves it on the user's. The engine hashes the next token's
logits after every prompt (its logits digest). A sample of the prompts that reused KV is kept
here; in idle time the engine computes such a prompt from nothing and hands back its digest. A
difference means that this cache, model and build restore something a cold run does not compute:
it is logged, counted, and reuse stops for this namespace (every prompt computed in full) until
the user clears it (`chatapp cache verify --clear`).

The record is one small JSON file per namespace (model content, KV settings, library version)
beside the cache's stores, so it survives restarts; written under the folder's lock, since two
processes may share the folder. It holds the sampled prompts' tokens (as the stores hold their
KV): `cache clear` removes it with them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from cache.atomic_file import replace_atomically
from cache.maintenance import CHECKS_FOLDER, file_lock
from cache.stats import CheckStats

log = logging.getLogger(__name__)

KEPT_PENDING = 8  # sampled prompts waiting for idle time; older ones give way
KEPT_MISMATCHES = 8


@dataclass(frozen=True)
class ReusedPrompt:
    """A prompt answered with reused KV, and the digest of the logits after it."""

    tokens: tuple[int, ...]
    tier: str  # where the reused tokens came from: device, ram or disk
    reused: int  # where the prompt was cut: the tokens restored or kept
    digest: str
    build: str  # the llama.cpp build and CPU that computed the digest: only these compare


@dataclass(frozen=True)
class Mismatch:
    """A restore whose logits differed from a cold run's."""

    tier: str
    reused: int
    prompt_tokens: int
    build: str
    at: float  # time.time()

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.at))
        return (
            f"a prompt of {self.prompt_tokens:,} tokens with {self.reused:,} reused from {self.tier} "
            f"answered unlike a cold run ({when})"
        )


@dataclass(frozen=True)
class CheckCounts:
    checked: int
    equal: int
    mismatched: int
    pending: int
    suspended: bool

    def as_stats(self) -> CheckStats:
        return cast(CheckStats, asdict(self))  # the same fields, by construction


class RestoreChecks:
    """The sample of reused prompts to check, the outcomes, and the stop a mismatch sets.

    `every`: one reused prompt in this many is kept for a check (the first of a session always);
    0 keeps none, though the counts and a stop set earlier still hold. Thread-safe.
    """

    def __init__(self, directory: Path, namespace_id: str, *, every: int = 0, enabled: bool = True) -> None:
        self.path = directory / CHECKS_FOLDER / f"{namespace_id}.json"
        self.every = every
        self.enabled = enabled  # False where the folder cannot be written: kept in memory only
        self._offered = 0
        self._allowed = False  # reuse_allowed()
        self._seen = (0, 0, 0)  # the record's file when last read or written (_signature)
        self._lock = threading.Lock()
        self._state = self._read() if enabled else _empty()

    # Sampling (the engine thread).
    def offer(self, prompt: ReusedPrompt) -> bool:
        """Keep `prompt` for a check if it is one of the sample; whether it was kept."""
        if self.every <= 0 or not prompt.reused:
            return False
        with self._lock:
            self._offered += 1
            if (self._offered - 1) % self.every:
                return False

        def keep(state: dict[str, Any]) -> None:
            pending = [entry for entry in state["pending"] if entry["tokens"] != list(prompt.tokens)]
            state["pending"] = [*pending, asdict(prompt) | {"tokens": list(prompt.tokens)}][-KEPT_PENDING:]

        self._change(keep)
        return True

    def take(self, build: str) -> list[ReusedPrompt]:
        """Every kept prompt whose digest this build computed, no longer kept (a check made elsewhere:
        `put_back` what it could not finish)."""
        taken: list[ReusedPrompt] = []

        def remove(state: dict[str, Any]) -> None:
            taken.extend(_prompt_of(entry) for entry in state["pending"] if entry["build"] == build)
            state["pending"] = [entry for entry in state["pending"] if entry["build"] != build]

        self._change(remove)
        return taken

    def put_back(self, prompts: list[ReusedPrompt]) -> None:
        def keep(state: dict[str, Any]) -> None:
            back = [asdict(prompt) | {"tokens": list(prompt.tokens)} for prompt in prompts]
            state["pending"] = [*back, *state["pending"]][-KEPT_PENDING:]

        if prompts:
            self._change(keep)

    def drop(self, prompt: ReusedPrompt) -> None:
        """No longer keep `prompt` (it cannot be checked here: too long for the context, not this vocabulary's)."""
        self._change(lambda state: state.update(pending=[e for e in state["pending"] if _prompt_of(e) != prompt]))

    def next(self, build: str) -> ReusedPrompt | None:
        """The oldest kept prompt whose digest this build computed, or None (always while checks are off:
        the samples kept wait for `cache verify` or a session that checks)."""
        if self.every <= 0:
            return None
        with self._lock:
            for entry in self._state["pending"]:
                if entry.get("build") == build:
                    return _prompt_of(entry)
        return None

    def done(self, prompt: ReusedPrompt, cold_digest: str) -> bool:
        """Record the cold run's digest for `prompt`; whether it equals the reused run's."""
        equal = cold_digest == prompt.digest

        def count(state: dict[str, Any]) -> None:
            state["pending"] = [entry for entry in state["pending"] if _prompt_of(entry) != prompt]
            state["checked"] += 1
            if equal:
                state["equal"] += 1
            else:
                mismatch = Mismatch(prompt.tier, prompt.reused, len(prompt.tokens), prompt.build, time.time())
                state["mismatches"] = [*state["mismatches"], asdict(mismatch)][-KEPT_MISMATCHES:]
                state["suspended"] = True

        self._change(count)
        if not equal:
            log.error(
                "a restore check failed: %s; reuse is stopped for this model and build until "
                "`chatapp cache verify --clear`",
                self.mismatches()[-1].describe(),
            )
        return equal

    # What the app shows and does.
    @property
    def suspended(self) -> bool:
        """Whether a failed check stops reuse; read again when another process (`cache verify`) changed it."""
        self._refresh_if_changed()
        with self._lock:
            return bool(self._state["suspended"]) and not self._allowed

    @contextlib.contextmanager
    def reuse_allowed(self) -> Iterator[None]:
        """Reuse goes on inside, stop or not (this object only): `chatapp cache verify` checks it again."""
        with self._lock:
            self._allowed = True
        try:
            yield
        finally:
            with self._lock:
                self._allowed = False

    def mismatches(self) -> list[Mismatch]:
        with self._lock:
            return [Mismatch(**entry) for entry in self._state["mismatches"]]

    def counts(self) -> CheckCounts:
        with self._lock:
            state = self._state
            mismatched = state["checked"] - state["equal"]
            suspended = bool(state["suspended"])
            return CheckCounts(state["checked"], state["equal"], mismatched, len(state["pending"]), suspended)

    def clear(self) -> bool:
        """Let reuse start again (the mismatches stay listed, the counts too); False where the record could not
        be written (the stop then holds for other processes)."""
        return self._change(lambda state: state.update(suspended=False))

    def refresh(self) -> None:
        """Read what another process (`chatapp cache verify`) may have written."""
        if self.enabled:
            with self._lock:
                self._state = self._read()

    def _refresh_if_changed(self) -> None:
        if self.enabled and self._signature() != self._seen:
            self.refresh()

    def _signature(self) -> tuple[int, int, int]:
        """What tells the record's file changed: its inode, modification time and size (a write in the same
        clock tick as the last read replaces the inode)."""
        try:
            stat = self.path.stat()
        except OSError:
            return (0, 0, 0)
        return (stat.st_ino, stat.st_mtime_ns, stat.st_size)

    # The file.
    def _change(self, change: Callable[[dict[str, Any]], None]) -> bool:
        """Apply `change` to the record as the file holds it now, under the folder's lock (another process
        may share the folder), and write it back; whether it was written (in memory only where the folder
        cannot be written)."""
        with self._lock:
            if self.enabled:
                try:
                    self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                    with file_lock(self.path.parent / ".lock"):
                        state = self._read()
                        change(state)
                        replace_atomically(self.path, json.dumps(state), durable=False)
                        self._seen = self._signature()
                    self._state = state
                    return True
                except OSError as error:  # a full or read-only folder: this session counts in memory
                    log.warning("could not write the restore checks in %s (%s)", self.path.parent, error)
                    self.enabled = False
            change(self._state)
            return False

    def _read(self) -> dict[str, Any]:
        """The record; a file is input, so anything of the wrong shape reads as absent."""
        try:
            self._seen = self._signature()
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return _empty()
        state = _empty()
        if not isinstance(data, dict):
            return state
        for key in ("checked", "equal"):
            if isinstance(data.get(key), int) and data[key] >= 0:
                state[key] = data[key]
        state["equal"] = min(state["equal"], state["checked"])
        state["suspended"] = data.get("suspended") is True
        state["pending"] = [entry for entry in _list(data, "pending") if _valid(entry, PROMPT_FIELDS)]
        state["mismatches"] = [entry for entry in _list(data, "mismatches") if _valid(entry, MISMATCH_FIELDS)]
        return state


PROMPT_FIELDS = {"tokens": list, "tier": str, "reused": int, "digest": str, "build": str}
MISMATCH_FIELDS = {"tier": str, "reused": int, "prompt_tokens": int, "build": str, "at": float}


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    return value if isinstance(value, list) else []


def _valid(entry: object, fields: dict[str, type]) -> bool:
    if not isinstance(entry, dict) or set(entry) != set(fields):
        return False
    if not all(isinstance(entry[name], kind) for name, kind in fields.items()):
        return False
    if "tokens" not in entry:
        return True
    tokens = entry["tokens"]
    return bool(tokens) and all(
        isinstance(token, int) and not isinstance(token, bool) and token >= 0 for token in tokens
    )


def _empty() -> dict[str, Any]:
    return {"checked": 0, "equal": 0, "suspended": False, "pending": [], "mismatches": []}


def _prompt_of(entry: dict[str, Any]) -> ReusedPrompt:
    return ReusedPrompt(
        tuple(entry["tokens"]), str(entry["tier"]), int(entry["reused"]), str(entry["digest"]), str(entry["build"])
    )


def folder_counts(directory: Path) -> CheckStats:
    """The checks of every namespace in a cache folder, added up (`cache stats` without a model)."""
    total = CheckCounts(0, 0, 0, 0, False)
    for record in sorted((directory / CHECKS_FOLDER).glob("*.json")):
        counts = RestoreChecks(directory, record.stem).counts()
        total = CheckCounts(
            total.checked + counts.checked,
            total.equal + counts.equal,
            total.mismatched + counts.mismatched,
            total.pending + counts.pending,
            total.suspended or counts.suspended,
        )
    return total.as_stats()
