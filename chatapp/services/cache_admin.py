"""`chatapp cache stats|prune|clear`: the cache folder's state, without loading a model."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from cache import maintenance
from cache.memory_kinds import MemoryKind, memory_of
from cache.restore_checks import folder_counts
from cache.tiers import REUSING_TIERS
from chatapp.errors import ChatappError
from chatapp.models.file_types import ggml_type_name
from chatapp.models.machine import resolve_model
from chatapp.records import PinRecord
from chatapp.services.library import DATABASE_NAME, open_library
from chatapp.services.pins import describe_pin
from chatapp.services.startup import Workspace
from chatapp.services.units import byte_size

MEMORY_KIND_NAMES = {
    "plain": "plain KV cache",
    "iswa": "sliding window",
    "recurrent": "recurrent state",
    "hybrid": "attention + recurrent state",
    "hybrid-iswa": "sliding window + recurrent state",
}


def describe_checks(checks: Mapping[str, Any] | None) -> str | None:
    """The restore checks' outcome in one line (the cache screen, `cache stats`); None when there are none."""
    if not checks:
        return None
    if checks["suspended"]:
        return (
            f"REUSE STOPPED: {checks['mismatched']:,} of {checks['checked']:,} checked answers that reused the "
            "cache differed from a cold run; that model's prompts are computed in full until `chatapp cache "
            "verify --clear` resumes reuse"
        )
    if not checks["checked"] and not checks["pending"]:
        return "no answer that reused the cache has been checked against a cold run yet"
    pending = f" ({checks['pending']:,} waiting for idle time)" if checks["pending"] else ""
    return (
        f"so far {checks['equal']:,} of {checks['checked']:,} answers that reused the cache, computed again without "
        f"it, had bit-identical logits{pending}"
    )


def describe_memory(kind: str, window: int, interval_tokens: int, grid: int = 0, kv_type: str = "f16") -> str:
    """What reuse a model's memory allows, in one line (the cache screen, `cache stats`); `grid`: the
    fixed batch size its prompts are computed in (split_rule.py), 0 where batches end anywhere; `kv_type`:
    the number format of the KV cells, said when it is not f16."""
    cells = f"; KV cells in {kv_type}" if kv_type != "f16" else ""
    return _reuse_allowed(kind, window, interval_tokens, grid) + cells


def _reuse_allowed(kind: str, window: int, interval_tokens: int, grid: int) -> str:
    fixed = (
        f"; prompts computed in fixed {grid}-token batches (this model's results depend on where a batch "
        "ends), reused in whole batches"
        if grid
        else ""
    )
    try:
        memory = memory_of(MemoryKind(kind), window)
    except ValueError:  # a kind a newer chatapp wrote: say only its name
        return f"{kind} memory{fixed}"
    if not memory.restores_at_checkpoints:
        if grid:
            return f"plain KV cache: a cached prefix is restored and cut at whole batches{fixed}"
        return "plain KV cache: any cached prefix is restored, token-exact, and cut anywhere"
    what = " and ".join(memory.whole_sections())
    blocks = "full-attention KV in blocks; " if memory.has_blocks else ""
    return (
        f"{MEMORY_KIND_NAMES.get(kind, kind)}: {blocks}{what} checkpointed at persona, document and turn ends and "
        f"every {interval_tokens:,} tokens; a cached prefix resumes at the last checkpoint it shares{fixed}"
    )


def _kv_type_name(ggml_type: int) -> str:
    """The KV cells' type as the folder's last model stored it ("f16" when unknown: not said)."""
    return ggml_type_name(ggml_type).lower() if ggml_type >= 0 else "f16"


def cache_stats(workspace: Workspace) -> dict[str, Any]:
    """Sizes and budgets per tier, and lifetime counters summed over every session."""
    directory = workspace.kv_cache_dir
    settings = workspace.settings
    totals = maintenance.read_totals(directory)
    with _readable_cache(directory):
        usage = maintenance.disk_usage(directory)
    prompt_tokens = int(totals.get("prompt_tokens", 0))
    reused = int(totals.get("reused_tokens", 0))
    memory = maintenance.read_memory(directory)
    with _readable_cache(directory):
        models = models_in_cache(directory)
    return {
        "models": models,
        "pins": [_pin_fields(pin) for pin in _pins(workspace)],
        "memory": {
            "kind": str(memory.get("kind", "unknown")),
            "window": int(memory.get("window", 0)),
            "description": describe_memory(
                str(memory.get("kind", "unknown")),
                int(memory.get("window", 0)),
                checkpoint_interval(workspace),
                kv_type=_kv_type_name(int(memory.get("k_type", -1))),
            )
            if memory
            else "no model has used this cache folder yet",
        },
        "directory": str(directory),
        "requests": int(totals.get("requests", 0)),
        "prompt_tokens": prompt_tokens,
        "reused_tokens": reused,
        "hit_rate": round(reused / prompt_tokens, 4) if prompt_tokens else 0.0,
        "reused_by_tier": totals.get("reused_by_tier", dict.fromkeys(REUSING_TIERS, 0)),
        "device": {"sequences": settings.sequences, "tokens_per_sequence": settings.context_cap},
        "ram": {
            "budget_bytes": settings.cache_ram_mib << 20,
            "eviction_policy": settings.cache_eviction,
            **_counters(totals.get("ram")),
        },
        "disk": {
            **usage,
            "budget_bytes": settings.cache_disk_mib << 20,
            "ttl_days": settings.cache_ttl_days,
            **_counters(totals.get("disk")),
        },
        "checks": folder_counts(directory),
    }


def _pins(workspace: Workspace) -> list[PinRecord]:
    """The pins the conversations database lists (none where there is no database yet: it is not made here)."""
    if not (workspace.paths.root / DATABASE_NAME).exists():
        return []
    library = open_library(workspace)
    try:
        return library.pins.list()
    finally:
        library.close()


def _pin_fields(pin: PinRecord) -> dict[str, Any]:
    return {
        "kind": pin.kind,
        "label": pin.label,
        "tokens": len(pin.tokens),
        "expires_at": pin.expires_at,
        "description": describe_pin(pin),
    }


def models_in_cache(directory: Path) -> list[dict[str, Any]]:
    """Entries and bytes per model (its namespaces together), the largest first."""
    labels = maintenance.read_namespaces(directory)
    by_model: dict[str, dict[str, Any]] = {}
    for namespace, usage in maintenance.usage_by_namespace(directory).items():
        label = labels.get(namespace, {})
        key = str(label.get("fingerprint") or namespace)
        row = by_model.setdefault(
            key,
            {
                "model": str(label.get("model") or f"unknown model (namespace {namespace[:8]})"),
                "path": str(label.get("path") or ""),
                "entries": 0,
                "bytes": 0,
                "namespaces": [],
            },
        )
        row["entries"] += usage["entries"]
        row["bytes"] += usage["bytes"]
        row["namespaces"].append(namespace)
    return sorted(by_model.values(), key=lambda row: -int(row["bytes"]))


def _counters(values: Any) -> dict[str, int]:
    names = ("hits", "misses", "evictions", "expirations", "bytes_written", "bytes_read")
    values = values if isinstance(values, dict) else {}
    return {name: int(values.get(name, 0)) for name in names}


def format_stats(stats: dict[str, Any]) -> str:
    """A short human-readable report."""
    ram, disk = stats["ram"], stats["disk"]
    by_tier = stats["reused_by_tier"]
    header = (
        f"{'tier':<6} {'entries':>8} {'bytes':>10} {'budget':>10} {'hits':>8} {'misses':>8} "
        f"{'evicted':>8} {'expired':>8} {'written':>10} {'read':>10}"
    )
    rows = [
        f"KV cache in {stats['directory']}",
        f"memory of the last model used: {stats['memory']['description']}",
        *([f"restore checks: {checks}"] if (checks := describe_checks(stats.get("checks"))) else []),
        header,
        _row("ram", "-", "-", ram),
        _row("disk", f"{disk['entries']:,}", byte_size(disk["bytes"]), disk),
        f"device: {stats['device']['sequences']} sequences of up to {stats['device']['tokens_per_sequence']:,} tokens, "
        "resident in the llama.cpp context while the app runs",
        f"pinned: {disk['pinned_entries']:,} entries, {byte_size(disk['pinned_bytes'])}"
        + (f", {len(stats['pins'])} prefixes:" if stats["pins"] else ""),
        *(f"  {pin['description']}" for pin in stats["pins"]),
        f"eviction: ram by {ram.get('eviction_policy', 'lru')}, disk by lru",
        f"by model ({len(stats['models'])}):" if stats["models"] else "by model: nothing stored yet",
        *(
            f"  {row['model']}: {row['entries']:,} {'entry' if row['entries'] == 1 else 'entries'}, "
            f"{byte_size(row['bytes'])}" + (f" ({row['path']})" if row["path"] else "")
            for row in stats["models"]
        ),
        f"hit rate: {stats['hit_rate']:.1%} ({stats['reused_tokens']:,} "
        f"of {stats['prompt_tokens']:,} prompt tokens reused "
        f"over {stats['requests']:,} requests: device {by_tier.get('device', 0):,}, ram {by_tier.get('ram', 0):,}, "
        f"disk {by_tier.get('disk', 0):,})",
    ]
    return "\n".join(rows)


def _row(name: str, entries: str, size: str, tier: dict[str, Any]) -> str:
    return (
        f"{name:<6} {entries:>8} {size:>10} {byte_size(tier['budget_bytes']):>10} "
        f"{tier['hits']:>8,} {tier['misses']:>8,} "
        f"{tier['evictions']:>8,} {tier['expirations']:>8,} "
        f"{byte_size(tier['bytes_written']):>10} {byte_size(tier['bytes_read']):>10}"
    )


def checkpoint_interval(workspace: Workspace) -> int:
    """Tokens between checkpoints of a long prompt, from the settings."""
    return workspace.settings.checkpoint_every_blocks * workspace.settings.cache_block_size


def prune_cache(workspace: Workspace) -> int:
    with _readable_cache(workspace.kv_cache_dir):
        return maintenance.prune(workspace.kv_cache_dir)


@contextlib.contextmanager
def _readable_cache(directory: Path) -> Iterator[None]:
    """A cache database that cannot be read is one line with the fix, not a traceback."""
    try:
        yield
    except (sqlite3.Error, OSError) as error:
        raise ChatappError(
            f"cannot read the KV cache in {directory} ({error}); `chatapp cache clear` empties it "
            "(conversations stay), or start chatapp, which sets a damaged cache aside"
        ) from None


def clear_model_cache(workspace: Workspace, model: str) -> tuple[str, int]:
    """Every cached entry of one model (a path or a name `chatapp models` lists), the others kept;
    (the model's file name, entries removed). Pins of its entries stay listed until they miss."""
    directory = workspace.kv_cache_dir
    path = resolve_model(Path(model), workspace.model_catalog)
    with _readable_cache(directory):
        rows = models_in_cache(directory)
        namespaces = {namespace for row in rows if row["path"] == str(path) for namespace in row["namespaces"]}
        return path.name, maintenance.clear_namespaces(directory, namespaces) if namespaces else 0


def clear_cache(workspace: Workspace) -> int:
    """Every cached entry and its files, and the list of pins (they named entries now gone)."""
    removed = maintenance.clear(workspace.kv_cache_dir)
    library = open_library(workspace)
    try:
        library.pins.clear()
    finally:
        library.close()
    return removed
