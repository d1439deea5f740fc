"""Figure G: eviction policies replayed on request traces, beside Belady's offline optimum. No model needed.

Each trace variant (traces.py) is replayed against one RAM budget well below its working set
under LRU, LFU and the value policy (cache/eviction.py's own classes, with their defaults, as
the RAM tier runs them) and under Belady's furthest-next-use choice (the limit no online policy
can pass with blocks of one size); trace_replay.py says how. Then the value policy again for each
quantized KV type at the same budget in bytes: as many more tokens as its cells are smaller
(kv_types.py). And sizing advice (cache/sizing.py) checked against the replay: the log of an LRU and
a value-policy replay at the budget predicts that replay's hit rate, and suggests a budget (the
smallest within half a point of unlimited), whose replay is measured against the prediction. Fixed
seeds: the same figures on every machine, in seconds.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from cache.eviction import ATTENTION_TOKENS, EvictionPolicy, LfuPolicy, LruPolicy, ValuePolicy, make_policy
from cache.request_log import LoggedEvent, columns_of
from cache.sizing import RequestHistory, enough_budget
from chatapp.benchmark.goals import Verdict, trace_verdicts
from chatapp.benchmark.trace_replay import PER_TOKEN_MS, BeladyPolicy, ReplayResult, next_use_table, replay
from chatapp.benchmark.traces import DAY_S, TRACE_VARIANTS, Trace, make_trace
from chatapp.engine.opening import KvType

TRACE_NAME = "G"  # chosen with --workloads beside the peer workloads and L, S
# 512 blocks of 64 tokens: about a tenth of the most an unbounded cache holds at once on the zipf
# trace with this TTL (its peak of live blocks, 5,432) and 3% of the blocks the trace ever uses.
BUDGET_BLOCKS = 512
TTL_S = 2 * DAY_S  # sessions come back after half a day to three days: some find their blocks expired
POLICY_ORDER = ("lru", "lfu", "value", "belady")


@dataclass(frozen=True)
class AdviceCheck:
    """Sizing advice from a replay's log, against replays (token hit rates)."""

    budget_tokens: int
    measured: float
    predicted: float
    suggested_tokens: int  # the suggested budget (the smallest within half a point of unlimited)
    suggested_measured: float
    suggested_predicted: float


ADVICE_POLICIES = ("lru", "value")
ADVICE_WITHIN = 0.005  # a suggested budget reuses within half a point of an unlimited one (as `cache advise`)


@dataclass(frozen=True)
class TraceFigures:
    budget_tokens: int
    ttl_s: float
    traces: dict[str, dict[str, int]]  # variant -> requests, blocks, prompt tokens
    results: dict[str, dict[str, ReplayResult]]  # variant -> policy -> replay
    elapsed_s: float
    # variant -> quantized KV type -> the value policy at the budget's bytes in that type
    by_kv_type: dict[str, dict[str, ReplayResult]] = field(default_factory=dict)
    advice: dict[str, dict[str, AdviceCheck]] = field(default_factory=dict)  # variant -> policy -> check

    def hit_rates(self) -> dict[str, dict[str, float]]:
        return {
            variant: {name: result.hit_rate for name, result in by_policy.items()}
            for variant, by_policy in self.results.items()
        }


def measure_traces(scale: float = 1.0, variants: tuple[str, ...] = TRACE_VARIANTS) -> TraceFigures:
    """Replay every variant under every policy; `scale` shrinks population, sessions and budget alike."""
    started = time.perf_counter()
    traces: dict[str, dict[str, int]] = {}
    results: dict[str, dict[str, ReplayResult]] = {}
    by_kv_type: dict[str, dict[str, ReplayResult]] = {}
    advice: dict[str, dict[str, AdviceCheck]] = {}
    budget_tokens = 0
    for variant in variants:
        trace = make_trace(variant, scale)
        budget_tokens = max(1, round(BUDGET_BLOCKS * scale)) * trace.block_tokens
        traces[variant] = {"requests": len(trace.chains), "blocks": trace.blocks, "prompt_tokens": trace.prompt_tokens}
        online: list[EvictionPolicy] = [LruPolicy(), LfuPolicy(), ValuePolicy()]
        policies = [*online, BeladyPolicy(next_use_table(trace), TTL_S)]
        results[variant] = {policy.name: replay(trace, policy, budget_tokens, TTL_S) for policy in policies}
        by_kv_type[variant] = {
            kv_type: replay(trace, ValuePolicy(), equal_bytes(budget_tokens, kv_type), TTL_S)
            for kv_type in KvType
            if kv_type.quantized
        }
        advice[variant] = {name: check_advice(trace, name, budget_tokens) for name in ADVICE_POLICIES}
    return TraceFigures(budget_tokens, TTL_S, traces, results, time.perf_counter() - started, by_kv_type, advice)


def check_advice(trace: Trace, policy: str, budget_tokens: int) -> AdviceCheck:
    """Replay at `budget_tokens` with a log; the prediction from it there, and at the budget it suggests."""
    log: list[LoggedEvent] = []
    measured = replay(trace, make_policy(policy), budget_tokens, TTL_S, log)
    gains = RequestHistory(columns_of(log)).gains(TTL_S)
    budgets = [float(budget_tokens * 2.0**step) for step in range(-4, 9)]
    suggested = enough_budget(gains, budgets, ADVICE_WITHIN * measured.prompt_tokens)
    suggested_tokens = int(min(suggested, budgets[-1]))
    at_suggestion = replay(trace, make_policy(policy), suggested_tokens, TTL_S)
    prompt = measured.prompt_tokens
    return AdviceCheck(
        budget_tokens,
        measured.hit_rate,
        gains.reused_at(budget_tokens) / prompt,
        suggested_tokens,
        at_suggestion.hit_rate,
        gains.reused_at(suggested_tokens) / prompt,
    )


def equal_bytes(f16_tokens: int, kv_type: KvType) -> int:
    """Tokens of `kv_type` that fit in the bytes of `f16_tokens` tokens of f16."""
    return int(f16_tokens * KvType.F16.bytes_per_value / kv_type.bytes_per_value)


def trace_figure_verdicts(figures: TraceFigures | None) -> list[Verdict]:
    if figures is None:
        return []
    verdicts = trace_verdicts(figures.hit_rates())
    for variant, by_type in figures.by_kv_type.items():
        f16 = figures.results[variant]["value"].hit_rate
        for kv_type, result in by_type.items():
            name = f"{variant}: token hit rate at equal bytes, value policy, {kv_type} - f16 (points)"
            gain = (result.hit_rate - f16) * 100
            verdicts.append(Verdict("G", name, gain, ">= 0", gain >= 0))
    for variant, by_policy in figures.advice.items():
        for policy, check in by_policy.items():
            verdicts += advice_verdicts(f"{variant}, {policy}", check)
    return verdicts


def advice_verdicts(label: str, check: AdviceCheck) -> list[Verdict]:
    """Issue 35's goals: the prediction within 2 points of the replay, at the budget and at the suggestion."""
    here = (check.predicted - check.measured) * 100
    there = (check.suggested_predicted - check.suggested_measured) * 100
    return [
        Verdict("G", f"{label}: advice, predicted - measured at the budget (points)", here, "|x| <= 2", abs(here) <= 2),
        Verdict(
            "G", f"{label}: advice, predicted - measured at its suggestion (points)", there, "|x| <= 2", abs(there) <= 2
        ),
    ]


def trace_record(figures: TraceFigures) -> dict[str, Any]:
    """For bench.json."""
    return {
        "budget_tokens": figures.budget_tokens,
        "ttl_s": figures.ttl_s,
        "cost_model": f"a token at position p costs {PER_TOKEN_MS:g} ms x (1 + p / {ATTENTION_TOKENS:g})",
        "traces": figures.traces,
        "results": {
            variant: {name: {**asdict(result), "hit_rate": result.hit_rate} for name, result in by_policy.items()}
            for variant, by_policy in figures.results.items()
        },
        "elapsed_s": figures.elapsed_s,
        "value_policy_at_equal_bytes": {
            variant: {kv_type: {**asdict(result), "hit_rate": result.hit_rate} for kv_type, result in by_type.items()}
            for variant, by_type in figures.by_kv_type.items()
        },
        "advice": {
            variant: {policy: asdict(check) for policy, check in by_policy.items()}
            for variant, by_policy in figures.advice.items()
        },
    }


def trace_table(figures: TraceFigures) -> str:
    """A few lines for the terminal: token hit rate and compute time per variant and policy."""
    lines = [
        f"G  request traces against a RAM budget of {figures.budget_tokens:,} tokens, TTL "
        f"{figures.ttl_s / DAY_S:g} days ({figures.elapsed_s:.1f} s): token hit rate / compute s "
        f"(a token at position p: {PER_TOKEN_MS:g} ms x (1 + p / {ATTENTION_TOKENS:g}))",
        f"     {'trace':8} {'requests':>8} {'no cache':>9}  " + "  ".join(f"{name:>16}" for name in POLICY_ORDER),
    ]
    for variant, by_policy in figures.results.items():
        shape = figures.traces[variant]
        no_cache = next(iter(by_policy.values())).no_cache_compute_s
        cells = [
            f"{result.hit_rate:7.2%} {result.compute_s:7.0f}s"
            for name in POLICY_ORDER
            if (result := by_policy.get(name)) is not None
        ]
        lines.append(f"     {variant:8} {shape['requests']:8,} {no_cache:8.0f}s  " + "  ".join(cells))
    if figures.by_kv_type:
        lines.append("     the value policy with the same bytes in quantized KV cells (more tokens fit):")
        for variant, by_type in figures.by_kv_type.items():
            cells = [
                f"{kv_type} {result.hit_rate:7.2%} {result.compute_s:7.0f}s" for kv_type, result in by_type.items()
            ]
            lines.append(f"     {variant:8} " + "  ".join(cells))
    if figures.advice:
        lines.append(
            "     advice from each replay's log: predicted / measured hit rate, at the budget, at its suggestion:"
        )
        for variant, checks in figures.advice.items():
            cells = [
                f"{policy} {check.predicted:.2%}/{check.measured:.2%}, {check.suggested_tokens:,} tokens "
                f"{check.suggested_predicted:.2%}/{check.suggested_measured:.2%}"
                for policy, check in checks.items()
            ]
            lines.append(f"     {variant:8} " + "  ".join(cells))
    return "\n".join(lines)
