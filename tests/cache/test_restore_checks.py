"""The restore checks' record: which reused prompts are sampled, what a check found, and the stop it sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cache.maintenance import CHECKS_FOLDER, clear
from cache.restore_checks import KEPT_PENDING, RestoreChecks, ReusedPrompt, folder_counts

NAMESPACE = "ab" * 16


def stopped(checks: RestoreChecks) -> bool:
    """Whether reuse is stopped now (a call: each read is the record as it is then)."""
    return checks.suspended


def reused(number: int, digest: str = "d", build: str = "cpu") -> ReusedPrompt:
    return ReusedPrompt(tuple(range(number, number + 5)), "disk", 3, digest, build)


def test_one_reused_prompt_in_every_is_kept_the_first_always(tmp_path: Path) -> None:
    checks = RestoreChecks(tmp_path, NAMESPACE, every=3)
    kept = [checks.offer(reused(number)) for number in range(7)]
    assert kept == [True, False, False, True, False, False, True]
    assert checks.counts().pending == 3
    assert checks.next("cpu") == reused(0)


def test_nothing_is_kept_when_off_or_when_nothing_was_reused(tmp_path: Path) -> None:
    assert not RestoreChecks(tmp_path, NAMESPACE, every=0).offer(reused(1))
    RestoreChecks(tmp_path, NAMESPACE, every=1).offer(reused(2))
    assert RestoreChecks(tmp_path, NAMESPACE, every=0).next("cpu") is None  # off: kept, but not checked here
    assert RestoreChecks(tmp_path, NAMESPACE, every=1).next("cpu") == reused(2)
    nothing_reused = ReusedPrompt((1, 2, 3), "none", 0, "d", "cpu")
    assert not RestoreChecks(tmp_path, NAMESPACE, every=1).offer(nothing_reused)
    assert RestoreChecks(tmp_path, NAMESPACE).counts().pending == 1


def test_a_check_counts_once_and_only_its_own_build_is_offered(tmp_path: Path) -> None:
    checks = RestoreChecks(tmp_path, NAMESPACE, every=1)
    checks.offer(reused(1, build="other cpu"))
    checks.offer(reused(2))
    assert checks.next("cpu") == reused(2)  # another CPU's digest compares with nothing computed here
    assert checks.done(reused(2), "d")
    assert checks.next("cpu") is None
    counts = checks.counts()
    assert (counts.checked, counts.equal, counts.mismatched, counts.pending) == (1, 1, 0, 1)
    assert not counts.suspended


def test_a_mismatch_stops_reuse_in_every_process_until_cleared(tmp_path: Path) -> None:
    checks = RestoreChecks(tmp_path, NAMESPACE, every=1)
    checks.offer(reused(1, digest="restored"))
    assert not checks.done(reused(1, digest="restored"), "cold")
    assert stopped(checks)
    later = RestoreChecks(tmp_path, NAMESPACE)  # a restart, or another process on the folder
    assert stopped(later)
    (mismatch,) = later.mismatches()
    assert (mismatch.tier, mismatch.reused, mismatch.prompt_tokens) == ("disk", 3, 5)
    assert "5 tokens with 3 reused from disk" in mismatch.describe()
    with later.reuse_allowed():  # `cache verify` checks again meanwhile
        allowed = not stopped(later)
    assert allowed
    assert stopped(later)
    later.clear()
    checks.refresh()
    assert not stopped(checks)
    assert checks.counts().mismatched == 1  # the history stays


def test_taken_prompts_are_no_longer_waiting_and_those_put_back_are(tmp_path: Path) -> None:
    checks = RestoreChecks(tmp_path, NAMESPACE, every=1)
    for number in range(3):
        checks.offer(reused(number))
    taken = checks.take("cpu")
    assert taken == [reused(0), reused(1), reused(2)]
    assert checks.next("cpu") is None
    checks.put_back(taken[1:])
    assert RestoreChecks(tmp_path, NAMESPACE, every=1).next("cpu") == reused(1)


def test_only_the_newest_samples_wait(tmp_path: Path) -> None:
    checks = RestoreChecks(tmp_path, NAMESPACE, every=1)
    for number in range(KEPT_PENDING + 3):
        checks.offer(reused(number))
    assert checks.counts().pending == KEPT_PENDING
    assert checks.next("cpu") == reused(3)


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "[]",
        json.dumps({"checked": -4, "equal": "x", "suspended": "yes", "pending": [{"tokens": ["a"]}], "mismatches": 3}),
        json.dumps({"pending": [{"tokens": [1], "tier": "disk", "reused": 1, "digest": "d", "build": 2}]}),
        json.dumps({"pending": [{"tokens": [], "tier": "disk", "reused": 1, "digest": "d", "build": "cpu"}]}),
        json.dumps({"pending": [{"tokens": [-1, 2], "tier": "disk", "reused": 1, "digest": "d", "build": "cpu"}]}),
    ],
)
def test_a_damaged_record_reads_as_empty_never_as_a_crash(tmp_path: Path, content: str) -> None:
    """A file is input: what does not have the record's shape is left out."""
    record = tmp_path / CHECKS_FOLDER / f"{NAMESPACE}.json"
    record.parent.mkdir()
    record.write_text(content)
    checks = RestoreChecks(tmp_path, NAMESPACE, every=1)
    counts = checks.counts()
    assert (counts.checked, counts.equal, counts.pending, counts.suspended) == (0, 0, 0, False)
    assert checks.next("cpu") is None
    assert checks.offer(reused(1))  # and it is written whole again
    assert RestoreChecks(tmp_path, NAMESPACE, every=1).next("cpu") == reused(1)


def test_the_folder_adds_up_every_model_and_clear_removes_the_samples(tmp_path: Path) -> None:
    first = RestoreChecks(tmp_path, NAMESPACE, every=1)
    second = RestoreChecks(tmp_path, "cd" * 16, every=1)
    first.offer(reused(1))
    first.done(reused(1), "d")
    second.offer(reused(2))
    second.done(reused(2), "other")
    assert folder_counts(tmp_path) == {"checked": 2, "equal": 1, "mismatched": 1, "pending": 0, "suspended": True}
    first.offer(reused(3))
    clear(tmp_path)  # `chatapp cache clear`: the sampled prompts' tokens are content
    assert not (tmp_path / CHECKS_FOLDER).exists()


def test_a_folder_that_cannot_be_written_keeps_counting_in_memory(tmp_path: Path) -> None:
    (tmp_path / CHECKS_FOLDER).write_text("a file where the folder should be")
    checks = RestoreChecks(tmp_path, NAMESPACE, every=1)
    assert checks.offer(reused(1))
    assert not checks.done(reused(1), "other")
    assert checks.suspended
    assert not checks.enabled
    assert not checks.clear()  # said, so that `cache verify --clear` does not claim it resumed reuse
    assert not checks.suspended  # this process goes on


def test_a_sample_that_cannot_be_checked_is_dropped(tmp_path: Path) -> None:
    checks = RestoreChecks(tmp_path, NAMESPACE, every=1)
    checks.offer(reused(1))
    checks.offer(reused(2))
    checks.drop(reused(1))
    assert checks.next("cpu") == reused(2)
    assert checks.counts().checked == 0
