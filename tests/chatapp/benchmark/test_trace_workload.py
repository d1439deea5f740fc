"""Workload G: request traces, their replay under each eviction policy, and its goals (no model)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from cache.eviction import LfuPolicy, LruPolicy, ValuePolicy
from cache.request_log import LoggedEvent, LoggedRequest, columns_of
from cache.sizing import RequestHistory
from chatapp.benchmark import runner
from chatapp.benchmark.goals import trace_verdicts
from chatapp.benchmark.trace_figure import TTL_S, equal_bytes, measure_traces, trace_figure_verdicts, trace_table
from chatapp.benchmark.trace_replay import BeladyPolicy, next_use_table, replay
from chatapp.benchmark.traces import TRACE_VARIANTS, make_trace
from chatapp.engine.kv_types import KvType

SMALL = 0.1


def test_a_trace_is_the_same_for_a_seed() -> None:
    one, again, other = make_trace("mixed", SMALL), make_trace("mixed", SMALL), make_trace("mixed", SMALL, seed=99)
    assert (one.times, one.chains, one.parents) == (again.times, again.chains, again.parents)
    assert one.chains != other.chains
    assert one.times == sorted(one.times)
    for chain in one.chains:  # each chain runs from the root, every block after its parent
        assert one.parents[chain[0]] == -1
        assert all(one.parents[child] == parent for parent, child in itertools.pairwise(chain))


def test_a_scan_adds_documents_used_once() -> None:
    def used_once(variant: str) -> int:
        trace = make_trace(variant, SMALL)
        uses = [0] * trace.blocks
        for chain in trace.chains:
            for block in chain:
                uses[block] += 1
        return uses.count(1)

    assert used_once("scan") > used_once("zipf") + 100


@pytest.mark.parametrize("variant", TRACE_VARIANTS)
def test_belady_reuses_at_least_what_every_online_policy_does(variant: str) -> None:
    trace = make_trace(variant, SMALL)
    budget = 40 * trace.block_tokens
    belady = replay(trace, BeladyPolicy(next_use_table(trace), TTL_S), budget, TTL_S)
    for policy in (LruPolicy(), LfuPolicy(), ValuePolicy()):
        online = replay(trace, policy, budget, TTL_S)
        assert online.prompt_tokens == belady.prompt_tokens
        assert online.reused_tokens <= belady.reused_tokens, policy.name
    unbounded = replay(trace, LruPolicy(), 10**12, TTL_S)
    assert unbounded.evictions == 0
    assert belady.reused_tokens <= unbounded.reused_tokens
    assert 0 < belady.compute_s < belady.no_cache_compute_s


def test_the_figure_reports_a_verdict_per_goal_and_variant() -> None:
    figures = measure_traces(SMALL)
    verdicts = trace_figure_verdicts(figures)
    by_type = [verdict for verdict in verdicts if "equal bytes" in verdict.measure]
    advice = [verdict for verdict in verdicts if "advice" in verdict.measure]
    policies = [verdict for verdict in verdicts if verdict not in by_type and verdict not in advice]
    assert len(advice) == 4 * len(TRACE_VARIANTS)  # LRU and value, at the budget and at its suggestion
    for verdict in advice:
        assert verdict.met == (abs(verdict.value) <= 2)
    for variant, by_policy in figures.advice.items():
        for policy, check in by_policy.items():
            assert check.measured == figures.results[variant][policy].hit_rate
            assert check.suggested_tokens >= check.budget_tokens // 16
            assert 0 < check.predicted < 1
    assert len(policies) == 2 * len(TRACE_VARIANTS)
    assert len(by_type) == 2 * len(TRACE_VARIANTS)  # q8_0 and q4_0 on each trace
    assert {verdict.goal for verdict in verdicts} == {"G"}
    for verdict in policies:
        assert verdict.value > 0
        assert verdict.met == (verdict.value >= 0.9 if "Belady" in verdict.measure else verdict.value > 1)
    for variant, results in figures.by_kv_type.items():
        f16 = figures.results[variant]["value"]
        assert results["q4_0"].reused_tokens >= results["q8_0"].reused_tokens >= f16.reused_tokens, variant
    for verdict in by_type:
        assert verdict.met == (verdict.value >= 0)
    assert all(variant in trace_table(figures) for variant in TRACE_VARIANTS)
    assert trace_figure_verdicts(None) == []


def test_equal_bytes_hold_as_many_more_tokens_as_the_cells_are_smaller() -> None:
    assert equal_bytes(340, KvType.F16) == 340
    assert equal_bytes(340, KvType.Q8_0) == 640
    assert equal_bytes(180, KvType.Q4_0) == 640


def test_trace_verdicts_on_known_rates() -> None:
    rates = {"zipf": {"value": 0.7, "lru": 0.72, "lfu": 0.5, "belady": 0.75}}
    by_measure = {verdict.measure: verdict for verdict in trace_verdicts(rates)}
    assert by_measure["zipf: token hit rate, value / Belady"].met  # 0.933
    assert not by_measure["zipf: token hit rate, value / best of LRU, LFU"].met  # behind LRU


def test_bench_runs_g_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--scale", "tiny", "--threads", "1", "--workloads", "G", "--peers", "chatapp", "--out", str(tmp_path)]
    assert runner.main(argv) == 0
    printed = capsys.readouterr().out
    assert "G  request traces" in printed
    report = json.loads((tmp_path / "bench.json").read_text())
    assert set(report["meta"]["cache_figures"]) == {"traces"}
    assert {goal["goal"] for goal in report["goals"]} == {"G"}


def test_a_replays_log_predicts_that_replay_at_its_budget_and_at_another() -> None:
    """The bench's cache model and sizing advice agree: the log of an LRU replay predicts it within a point,
    at its own budget and at four times it."""
    trace = make_trace("zipf", SMALL)
    budget = 40 * trace.block_tokens
    log: list[LoggedEvent] = []
    here = replay(trace, LruPolicy(), budget, TTL_S, log)
    assert sum(isinstance(event, LoggedRequest) for event in log) == len(trace.chains)
    gains = RequestHistory(columns_of(log)).gains(TTL_S)
    there = replay(trace, LruPolicy(), 4 * budget, TTL_S)
    assert abs(gains.reused_at(budget) - here.reused_tokens) <= 0.01 * here.prompt_tokens
    assert abs(gains.reused_at(4 * budget) - there.reused_tokens) <= 0.01 * there.prompt_tokens
    assert here.reused_tokens < there.reused_tokens
