"""`chatapp cache advise`: what other budgets and TTLs would have reused of the user's own requests.

cache/sizing.py does the counting; this turns it into the user's terms: budgets in GiB, reuse as a
share of prompt tokens and as seconds of prefill saved at the speed this machine measured, what the
disk would hold, and a suggested budget.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cache.request_log import log_files, read_columns
from cache.sizing import Gains, RequestHistory, enough_budget
from chatapp.errors import ChatappError
from chatapp.services.units import byte_size
from chatapp.settings import Settings

log = logging.getLogger(__name__)

MIB = 1 << 20
DAY_S = 24 * 3600.0
BUDGETS_MIB = [64 << step for step in range(12)]  # 64 MiB .. 128 GiB
TTL_DAYS = [1 / 24, 1.0, 7.0, 30.0]
ENOUGH_POINTS = 0.5  # a budget reaching within this many points of unlimited reuse is enough
# Fewer requests, or a shorter log, say too little about a user's habits to suggest a budget.
MIN_REQUESTS = 50
MIN_DAYS = 1 / 24


@dataclass(frozen=True)
class BudgetRow:
    budget_bytes: float  # inf: unlimited
    reused_share: float
    prefill_saved_s: float | None
    holds_bytes: int | None  # what the disk would hold at most: the budget, or all the log stored
    current: bool


@dataclass(frozen=True)
class Advice:
    log_files: list[str]
    requests: int
    days: float
    prompt_tokens: int
    measured_share: float
    predicted_share: float  # at today's budgets and TTL
    sample_rate: float
    processes: int  # each starts with an empty RAM tier
    ram_budget_bytes: int
    disk_budget_bytes: int
    ttl_days: float
    disk: list[BudgetRow]  # reuse against the disk budget, RAM as set
    ram: list[BudgetRow]  # reuse restored from RAM alone against the RAM budget
    ttl: list[tuple[float, float]]  # (days, share) at today's budgets
    suggestion: str
    suggested_disk_mib: int | None  # None: the budget in force is right

    def as_json(self) -> dict[str, Any]:
        record = asdict(self)
        for table in ("disk", "ram"):
            for row in record[table]:
                row["budget_bytes"] = None if math.isinf(row["budget_bytes"]) else int(row["budget_bytes"])
        return record


def advise(directory: Path, settings: Settings, logs: list[Path] | None = None) -> Advice | None:
    """Advice from the cache folder's request log (or `logs`, e.g. another machine's); None when it is empty."""
    files = logs if logs else log_files(directory)
    for path in files:
        if not path.is_file():
            raise ChatappError(f"no request log at {path}; pass a file written by chatapp (requests.log)")
    try:
        columns = read_columns(files)
    except OSError as error:
        raise ChatappError(f"cannot read the request log ({error})") from None
    if columns.requests == 0:
        if any(path.stat().st_size > 0 for path in files):
            raise ChatappError(
                "the request log holds no requests this version of chatapp can read (written by another version?)"
            )
        return None
    history = RequestHistory(columns)
    ram, disk, ttl = settings.cache_ram_mib * MIB, settings.cache_disk_mib * MIB, settings.cache_ttl_days * DAY_S
    ms_per_cost = history.prefill_ms_per_cost()
    total = max(history.prompt_tokens, 1)
    # The disk table and the prediction replay the RAM tier under its own policy; the RAM and TTL tables
    # are LRU's one pass (a replay per budget would take seconds each on a long log).
    by_disk = history.gains(ttl, ram_budget=ram, ram_policy=settings.cache_eviction)
    from_ram = history.gains(ttl, tier="ram")

    def rows(gains: Gains, current: int, disk_tier: bool) -> list[BudgetRow]:
        budgets = sorted({*(float(mib * MIB) for mib in BUDGETS_MIB), float(current), math.inf})
        return [
            BudgetRow(
                budget,
                gains.reused_at(budget) / total,
                gains.cost_at(budget) * ms_per_cost / 1000 if ms_per_cost is not None else None,
                int(min(budget, history.stored_bytes)) if disk_tier else None,
                budget == current,
            )
            for budget in budgets
        ]

    disk_rows = rows(by_disk, disk, disk_tier=True)
    enough_data = history.requests >= MIN_REQUESTS and history.seconds / DAY_S >= MIN_DAYS
    return Advice(
        [str(path) for path in files],
        history.requests,
        history.seconds / DAY_S,
        history.prompt_tokens,
        history.measured_reused / total,
        by_disk.reused_at(disk) / total,
        history.sample_rate,
        int(np.unique(columns.request_session).size),
        ram,
        disk,
        settings.cache_ttl_days,
        disk_rows,
        rows(from_ram, ram, disk_tier=False),
        [(days, history.gains(days * DAY_S, ram_budget=ram).reused_at(disk) / total) for days in TTL_DAYS],
        *(
            _suggestion(disk_rows, by_disk, total)
            if enough_data
            else (
                f"too few requests to size the tiers by ({history.requests:,} over {_days(history.seconds / DAY_S)}; "
                f"at least {MIN_REQUESTS} over an hour): ask again after using chatapp for a while",
                None,
            )
        ),
    )


class AdviceMemo:
    """Advice computed at most every `max_age_s` (a long log takes a second or two): for /metrics."""

    def __init__(self, directory: Path, settings: Settings, max_age_s: float = 600.0) -> None:
        self.directory, self.settings, self.max_age_s = directory, settings, max_age_s
        self._lock = threading.Lock()
        self._advice: Advice | None = None
        self._at = -math.inf
        self._failed = False

    def latest(self) -> Advice | None:
        """The advice, recomputed when older than `max_age_s`; None while nothing is logged or it cannot be read."""
        with self._lock:
            empty = self._advice is None and not self._failed  # nothing logged yet: asked again next time
            if empty or time.monotonic() - self._at >= self.max_age_s:
                self._failed = False
                try:
                    self._advice = advise(self.directory, self.settings)
                except ChatappError as error:
                    log.warning("no sizing advice for /metrics: %s", error)
                    self._advice, self._failed = None, True
                self._at = time.monotonic()
            return self._advice


def _suggestion(rows: list[BudgetRow], gains: Gains, total: int) -> tuple[str, int | None]:
    """The smallest disk budget that reuses within ENOUGH_POINTS of unlimited, said against today's; and its
    MiB (None when it is today's)."""
    current = next(row for row in rows if row.current)
    budgets = [row.budget_bytes for row in rows]
    enough_bytes = enough_budget(gains, budgets, ENOUGH_POINTS / 100 * total)
    enough = next(row for row in rows if row.budget_bytes == enough_bytes)
    if enough.budget_bytes == current.budget_bytes or math.isinf(enough.budget_bytes):
        return (
            f"the disk budget in force ({byte_size(int(current.budget_bytes))}) keeps what these requests reuse",
            None,
        )
    verb = "keep" if enough.budget_bytes > current.budget_bytes else "still keep"
    mib = int(enough.budget_bytes) // MIB
    text = (
        f"{byte_size(int(enough.budget_bytes))} of disk would {verb} {enough.reused_share:.1%} of prompt tokens "
        f"reused, against {current.reused_share:.1%} at {byte_size(int(current.budget_bytes))} "
        f"(cache_disk_mib = {mib})"
    )
    return text, mib


def advice_summary(advice: Advice) -> str:
    """Two lines: what the log holds, and reuse measured against predicted at the budgets in force."""
    return (
        f"{advice.requests:,} requests over {_days(advice.days)}, {advice.prompt_tokens:,} prompt tokens\n"
        f"reused: {advice.measured_share:.1%} measured; {advice.predicted_share:.1%} predicted at the budgets "
        f"in force (RAM {byte_size(advice.ram_budget_bytes)}, disk {byte_size(advice.disk_budget_bytes)}, "
        f"TTL {_days(advice.ttl_days)})"
        + (f" from a {advice.sample_rate:.0%} sample of the blocks" if advice.sample_rate < 1 else "")
    )


def format_advice(advice: Advice) -> str:
    """The advice as a short report."""
    lines = [
        f"log: {', '.join(advice.log_files)}",
        advice_summary(advice),
        "",
        "disk budget  reused (any tier)  prefill saved      holds",
        *(_row(row) for row in advice.disk),
        "",
        f"RAM budget   restored from RAM  prefill saved   (as LRU; {advice.processes:,} "
        f"process{'es' if advice.processes != 1 else ''}, each starting with an empty RAM tier)",
        *(_row(row) for row in advice.ram),
        "",
        "TTL (RAM as LRU): " + ", ".join(f"{_days(days)} {share:.1%}" for days, share in advice.ttl),
        "",
        f"suggestion: {advice.suggestion}",
    ]
    return "\n".join(lines)


def _row(row: BudgetRow) -> str:
    budget = "unlimited" if math.isinf(row.budget_bytes) else byte_size(int(row.budget_bytes))
    saved = "-" if row.prefill_saved_s is None else _seconds(row.prefill_saved_s)
    mark = "  <- in force" if row.current else ""
    holds = "" if row.holds_bytes is None else byte_size(row.holds_bytes)
    return f"{budget:>11}  {row.reused_share:>16.1%}  {saved:>13}  {holds:>9}{mark}"


def _days(days: float) -> str:
    if days < 1 / 24:
        return f"{days * 24 * 60:.0f} min"
    if days < 1:
        hours = days * 24
        return f"{hours:.0f} hour{'s' if round(hours) != 1 else ''}"
    return f"{days:g} day{'s' if days != 1 else ''}"


def _seconds(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
