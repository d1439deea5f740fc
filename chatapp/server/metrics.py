"""`GET /metrics`: what the server and its cache did, in the Prometheus text format.

Each server has its own registry (tests start several in one process). Request figures are
counted as answers end; the cache's own counters (evictions, expirations) are read from the
cache when scraped, so they never drift from `chatapp cache stats`; sizing advice (what other
disk budgets would have reused) is recomputed from the request log at most every ten minutes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from chatapp.services.cache_advice import Advice
from chatapp.services.completions import CompletionUsage

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class CacheCollector(Collector):
    """The cache's counters at scrape time."""

    def __init__(self, figures: Callable[[], dict[str, Any] | None]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        figures = self._figures()
        if figures is None:
            return
        evictions = CounterMetricFamily(
            "chatapp_cache_evictions", "Cache entries evicted to stay within a budget", labels=["tier"]
        )
        expirations = CounterMetricFamily("chatapp_cache_expirations", "Cache entries expired (TTL)", labels=["tier"])
        entries = GaugeMetricFamily("chatapp_cache_entries", "Cache entries held now", labels=["tier"])
        size = GaugeMetricFamily("chatapp_cache_bytes", "Bytes the cache holds now", labels=["tier"])
        for tier in ("ram", "disk"):
            tier_figures = figures[tier]
            evictions.add_metric([tier], tier_figures["evictions"])
            expirations.add_metric([tier], tier_figures["expirations"])
            entries.add_metric([tier], tier_figures["entries"])
            size.add_metric([tier], tier_figures["bytes"])
        yield from (evictions, expirations, entries, size)
        checks = figures.get("checks")
        if checks:  # restores computed again without the cache (cache/restore_checks.py), lifetime counts
            outcomes = CounterMetricFamily(
                "chatapp_cache_checks",
                "Prompts that reused cached KV, computed again without it: logits equal or not, bit for bit",
                labels=["outcome"],
            )
            outcomes.add_metric(["equal"], checks["equal"])
            outcomes.add_metric(["mismatched"], checks["mismatched"])
            yield outcomes
            yield GaugeMetricFamily(
                "chatapp_cache_reuse_stopped",
                "1 while a failed check has stopped reuse for this model and build (`chatapp cache verify --clear`)",
                value=int(checks["suspended"]),
            )


class AdviceCollector(Collector):
    """Sizing advice (chatapp/services/cache_advice.py) at scrape time: reuse predicted at each disk budget."""

    def __init__(self, advice: Callable[[], Advice | None]) -> None:
        self._advice = advice

    def collect(self) -> Iterator[GaugeMetricFamily]:
        advice = self._advice()
        if advice is None:
            return
        by_budget = GaugeMetricFamily(
            "chatapp_cache_predicted_reuse_ratio",
            "Share of prompt tokens the logged requests would have reused at a disk budget (RAM and TTL as set)",
            labels=["disk_budget_bytes"],
        )
        for row in advice.disk:
            budget = "+Inf" if math.isinf(row.budget_bytes) else str(int(row.budget_bytes))
            by_budget.add_metric([budget], row.reused_share)
        yield by_budget
        yield GaugeMetricFamily(
            "chatapp_cache_predicted_reuse_ratio_in_force",
            "Share of prompt tokens the logged requests reuse at the budgets in force, as predicted",
            value=advice.predicted_share,
        )
        yield GaugeMetricFamily(
            "chatapp_cache_logged_reuse_ratio",
            "Share of prompt tokens the logged requests reused, as measured",
            value=advice.measured_share,
        )
        if advice.suggested_disk_mib is not None:
            yield GaugeMetricFamily(
                "chatapp_cache_suggested_disk_bytes",
                "The smallest disk budget within half a point of an unlimited one's reuse",
                value=advice.suggested_disk_mib << 20,
            )


class EngineCollector(Collector):
    """The default model's settings that decide its speed, as the engine chose them at load."""

    def __init__(self, flash_attention: Callable[[], tuple[bool, str]]) -> None:
        self._flash_attention = flash_attention

    def collect(self) -> Iterator[GaugeMetricFamily]:
        on, why = self._flash_attention()
        flash = GaugeMetricFamily(
            "chatapp_flash_attention",
            "1 where llama.cpp's flash attention is on for the default model, with why (as set, measured, ...)",
            labels=["why"],
        )
        flash.add_metric([why], int(on))
        yield flash


class ServerMetrics:
    """The counters and histograms one server keeps."""

    def __init__(
        self,
        cache_figures: Callable[[], dict[str, Any] | None],
        advice: Callable[[], Advice | None] | None = None,
        flash_attention: Callable[[], tuple[bool, str]] | None = None,
    ) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # `*_created` samples are noise here
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter("chatapp_requests", "HTTP requests answered", ["route", "status"], registry=registry)
        self.prompt_tokens = Counter("chatapp_prompt_tokens", "Prompt tokens of completions", registry=registry)
        self.reused_tokens = Counter(
            "chatapp_reused_prompt_tokens", "Prompt tokens reused from the cache", ["tier"], registry=registry
        )
        self.computed_tokens = Counter(
            "chatapp_computed_prompt_tokens", "Prompt tokens computed (not reused)", registry=registry
        )
        self.generated_tokens = Counter("chatapp_generated_tokens", "Answer tokens generated", registry=registry)
        self.ttft = Histogram(
            "chatapp_time_to_first_token_seconds",
            "From the request to its first answer token",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.request_time = Histogram(
            "chatapp_request_duration_seconds",
            "From the request to its last answer token",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        registry.register(CacheCollector(cache_figures))
        if advice is not None:
            registry.register(AdviceCollector(advice))
        if flash_attention is not None:
            registry.register(EngineCollector(flash_attention))

    def completion_ended(self, usage: CompletionUsage) -> None:
        self.prompt_tokens.inc(usage.prompt_tokens)
        if usage.cached_tokens:
            self.reused_tokens.labels(usage.tier.value).inc(usage.cached_tokens)
        self.computed_tokens.inc(usage.computed_tokens)
        self.generated_tokens.inc(usage.completion_tokens)
        self.ttft.observe(usage.stats.ttft_ms / 1000)
        self.request_time.observe(usage.stats.total_ms / 1000)

    def text(self) -> bytes:
        return generate_latest(self.registry)
