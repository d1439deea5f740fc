"""Sizing advice as the app shows it: the suggestion's rules, and the memo /metrics reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cache.request_log import LoggedRequest, LoggedStore, RequestLog, encode_request, encode_store
from cache.tiers import ReuseTier
from chatapp.errors import ChatappError
from chatapp.services.cache_advice import MIN_REQUESTS, AdviceMemo, advise
from chatapp.settings import Settings

BLOCK_BYTES = 64 << 20  # 1 MiB a token: budgets of a few hundred MiB matter


def write_log(folder: Path, requests: int, spacing_s: float = 120.0, first: float = 0.0) -> None:
    """Conversations on 8 personas of 4 blocks: each asks, then stores what it computed."""
    folder.mkdir(parents=True, exist_ok=True)
    log = RequestLog(folder)
    stored: set[int] = set()
    rng = np.random.default_rng(1)
    for number in range(requests):
        when = first + number * spacing_s
        persona = int(rng.integers(0, 8))
        chain = [persona * 100 + depth + 1 for depth in range(4)]
        reused = 0
        while reused < len(chain) and chain[reused] in stored:
            reused += 1
        log.append(
            encode_request(
                LoggedRequest(
                    when, 1, 256, 256, 0, 64 * reused, ReuseTier.DISK if reused else ReuseTier.NONE, False, 64,
                    40.0 + 256 - 64 * reused, np.array(chain, dtype=np.uint64), np.zeros(0, np.uint64),
                    np.zeros(0, np.uint32),
                )
            )
        )  # fmt: skip
        new = [key for key in chain if key not in stored]
        stored.update(new)
        if new:
            count = len(new)
            log.append(
                encode_store(
                    LoggedStore(
                        when + 1, 1, np.array(new, dtype=np.uint64), np.zeros(count, np.uint64),
                        np.zeros(count, np.uint32), np.full(count, 64, np.uint32),
                        np.full(count, BLOCK_BYTES, np.uint64), np.zeros(count, bool),
                    )
                )
            )  # fmt: skip


def test_a_long_enough_log_gets_a_budget_suggested_and_a_short_one_does_not(tmp_path: Path) -> None:
    write_log(tmp_path / "short", MIN_REQUESTS - 1)
    short = advise(tmp_path / "short", Settings())
    assert short is not None
    assert short.suggested_disk_mib is None
    assert "too few requests" in short.suggestion
    write_log(tmp_path / "long", 200)
    no_ram = Settings(cache_ram_mib=0)  # one process's RAM of 2 GiB would hold every persona: the disk decides
    advice = advise(tmp_path / "long", no_ram)
    assert advice is not None
    # 8 personas of 4 blocks of 64 MiB: 2 GiB of disk holds them all; 10 GiB (the default) is more than needed.
    assert advice.suggested_disk_mib == 2048
    assert "cache_disk_mib = 2048" in advice.suggestion
    assert advice.predicted_share == pytest.approx(advice.measured_share)
    assert advice.disk[-1].reused_share == pytest.approx(advice.measured_share)
    assert all(row.prefill_saved_s is not None and row.prefill_saved_s >= 0 for row in advice.disk)
    small = advise(tmp_path / "long", Settings(cache_ram_mib=0, cache_disk_mib=512))
    assert small is not None
    assert small.predicted_share < advice.predicted_share  # half the personas fit in 512 MiB
    assert small.suggested_disk_mib == 2048


def test_a_log_this_version_cannot_read_is_said_so(tmp_path: Path) -> None:
    (tmp_path / "requests.log").write_bytes(b"written by some other program")
    with pytest.raises(ChatappError, match="no requests this version"):
        advise(tmp_path, Settings())


def test_the_memo_asks_again_until_something_is_logged_then_keeps_its_advice(tmp_path: Path) -> None:
    memo = AdviceMemo(tmp_path, Settings(), max_age_s=3600)
    assert memo.latest() is None
    write_log(tmp_path, 3)
    first = memo.latest()
    assert first is not None
    assert first.requests == 3
    write_log(tmp_path, 3, first=10_000.0)
    assert memo.latest() is first  # kept for an hour
    memo.max_age_s = 0
    renewed = memo.latest()
    assert renewed is not None
    assert renewed.requests == 6
