"""Summaries of a benchmark run: figures per peer and workload, a table, a JSON file, an SVG chart.

The run's raw results are plain dicts (what `runner` records); everything here is a pure
function of them, so it can be tested on made-up numbers.

Raw result, per peer and workload: {"peer", "workload", "wall_s", "peak_rss_bytes",
"start_rss_bytes", "disk_bytes", "requests": [{"label", "ttft_ms", "total_ms",
"prompt_tokens", "computed_tokens", "text"}...]}.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from chatapp.benchmark.goals import IDEAL, Verdict, goal_verdicts, reused_fraction
from chatapp.benchmark.workloads import AGENT_NAMES

NO_CACHE = "no-cache"
MIB = 1 << 20


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (position - low))


def ratio(value: float, base: float) -> float:
    return value / base if base and not math.isnan(base) and not math.isnan(value) else math.nan


def summarize_run(run: dict[str, Any]) -> dict[str, Any]:
    """Figures for one peer on one workload."""
    requests = run["requests"]
    ttfts = [request["ttft_ms"] for request in requests]
    prompt = sum(request["prompt_tokens"] for request in requests)
    computed = sum(request["computed_tokens"] for request in requests)
    return {
        "peer": run["peer"],
        "workload": run["workload"],
        "requests": len(requests),
        "ttft_median_ms": median(ttfts),
        "ttft_p95_ms": percentile(ttfts, 95),
        "prompt_tokens": prompt,
        "computed_tokens": computed,
        "hit_rate": 1 - computed / prompt if prompt else math.nan,
        "wall_s": run["wall_s"],
        "peak_rss_bytes": run.get("peak_rss_bytes", 0),
        "disk_bytes": run.get("disk_bytes", 0),
    }


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per peer and workload figures, with TTFT-median and computed-token ratios to the others.

    `ttft_vs_no_cache`: median TTFT / the no-cache peer's; `ttft_vs_best_other`: median TTFT /
    the lowest median TTFT among the other peers on the same workload (below 1: this peer wins).
    """
    rows = [summarize_run(run) for run in runs]
    by_workload: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_workload.setdefault(row["workload"], []).append(row)
    for group in by_workload.values():
        base = next((row for row in group if row["peer"] == NO_CACHE), None)
        for row in group:
            others = [
                other for other in group if other["peer"] != IDEAL and _family(other["peer"]) != _family(row["peer"])
            ]
            best = min(others, key=lambda other: other["ttft_median_ms"], default=None)
            row["ttft_vs_no_cache"] = ratio(row["ttft_median_ms"], base["ttft_median_ms"]) if base else math.nan
            row["computed_vs_no_cache"] = ratio(row["computed_tokens"], base["computed_tokens"]) if base else math.nan
            row["best_other_peer"] = best["peer"] if best else None
            row["ttft_vs_best_other"] = ratio(row["ttft_median_ms"], best["ttft_median_ms"]) if best else math.nan
    return rows


def _family(peer: str) -> str:
    """chatapp, chatapp+warm and chatapp+typed are one tool: none is another's "best other"."""
    return peer.split("+")[0]


def mismatches(runs: list[dict[str, Any]], reference_peer: str | None = None) -> list[dict[str, Any]]:
    """Requests whose answer text differs from the reference peer's (the first peer by default)."""
    if not runs:
        return []
    reference_peer = reference_peer or runs[0]["peer"]
    reference = {
        (run["workload"], index): request["text"]
        for run in runs
        if run["peer"] == reference_peer
        for index, request in enumerate(run["requests"])
    }
    found = []
    for run in runs:
        if run["peer"] == reference_peer:
            continue
        for check in run.get("cold_check", []):
            if not check["equal"]:
                found.append(
                    {
                        "peer": run["peer"],
                        "workload": run["workload"],
                        "label": check["label"],
                        "reference_peer": "the same prompt computed cold",
                        "expected": check["cold"],
                        "got": check["served"],
                    }
                )
        if run["workload"] in AGENT_NAMES:
            continue  # K's and J's servers each build their own prompt from the messages: checked against cold runs
        for index, request in enumerate(run["requests"]):
            expected = reference.get((run["workload"], index))
            if expected is not None and request["text"] != expected:
                found.append(
                    {
                        "peer": run["peer"],
                        "workload": run["workload"],
                        "request": index,
                        "label": request["label"],
                        "reference_peer": reference_peer,
                        "expected": expected,
                        "got": request["text"],
                    }
                )
    return found


def _fmt(value: float, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def table(rows: list[dict[str, Any]]) -> str:
    width = max([13, *(len(row["peer"]) for row in rows)])  # remote:HOST:PORT names are longer
    header = (
        f"{'wl':2} {'peer':{width}} {'n':>3} {'TTFT med':>9} {'p95':>8} {'computed/prompt':>17} {'hit':>5} "
        f"{'wall s':>7} {'peak RSS':>9} {'disk':>9} {'x no-cache':>10} {'x best other':>18}"
    )
    lines = [header, "-" * len(header)]
    workloads = list(dict.fromkeys(row["workload"] for row in rows))
    last = None
    for row in sorted(rows, key=lambda row: workloads.index(row["workload"])):
        if last is not None and row["workload"] != last:
            lines.append("")
        last = row["workload"]
        best = f"{_fmt(row['ttft_vs_best_other'], '.2f')} ({row['best_other_peer'] or '-'})"
        lines.append(
            f"{row['workload']:2} {row['peer']:{width}} {row['requests']:3d} {_fmt(row['ttft_median_ms'], '9.0f')} "
            f"{_fmt(row['ttft_p95_ms'], '8.0f')} {row['computed_tokens']:>8,}/{row['prompt_tokens']:<8,} "
            f"{_fmt(row['hit_rate'], '5.2f')} {row['wall_s']:7.1f} {row['peak_rss_bytes'] / MIB:7.0f}Mi "
            f"{row['disk_bytes'] / MIB:7.1f}Mi {_fmt(row['ttft_vs_no_cache'], '10.2f')} {best:>18}"
        )
    return "\n".join(lines)


def reuse_table(runs: list[dict[str, Any]], workload: str) -> str:
    """Per request of `workload`, the share of its prompt tokens each peer reused (reused / prompt)."""
    chosen = [run for run in runs if run["workload"] == workload]
    if not chosen:
        return ""
    requests = chosen[0]["requests"]
    width = max([7, *(len(request["label"]) for request in requests)])
    columns = [max(6, len(run["peer"])) for run in chosen]
    peers = " ".join(f"{run['peer']:>{column}}" for run, column in zip(chosen, columns, strict=True))
    lines = [
        f"{workload}: prompt tokens reused per request (reused / prompt)",
        f"  {'request':{width}} {'prompt':>7} {peers}",
    ]
    for index, request in enumerate(requests):
        shares = " ".join(
            f"{_fmt(reused_fraction(run['requests'][index]), '.3f') if index < len(run['requests']) else '-':>{column}}"
            for run, column in zip(chosen, columns, strict=True)
        )
        lines.append(f"  {request['label']:{width}} {request['prompt_tokens']:>7,} {shares}")
    return "\n".join(lines)


def _json_safe(value: object) -> object:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


def write_json(
    path: Path,
    meta: dict[str, Any],
    runs: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    found: list[dict[str, Any]],
    verdicts: Sequence[Verdict] = (),
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "meta": meta,
        "summary": rows,
        "goals": [verdict.as_dict() for verdict in verdicts],
        "mismatches": found,
        "runs": runs,
    }
    path.write_text(json.dumps(_json_safe(document), indent=1))
    return path


PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7"]


def svg_chart(rows: list[dict[str, Any]], title: str = "Median time to first token (ms), per workload and peer") -> str:
    """Grouped bars: one group per workload, one bar per peer (median TTFT); self-contained SVG."""
    workloads = list(dict.fromkeys(row["workload"] for row in rows))
    peers = list(dict.fromkeys(row["peer"] for row in rows))
    values = {(row["workload"], row["peer"]): row["ttft_median_ms"] for row in rows}
    finite = [value for value in values.values() if value is not None and not math.isnan(value)]
    top = max(finite, default=1.0) or 1.0
    bar, gap, left, bottom, plot_height = 18, 28, 70, 60, 300
    group_width = len(peers) * bar + gap
    width = left + max(len(workloads), 1) * group_width + 180
    height = plot_height + bottom + 50
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    base_y = 40 + plot_height
    for step in range(5):
        value = top * step / 4
        y = base_y - plot_height * step / 4
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - 180}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{value:.0f}</text>')
    for group, workload in enumerate(workloads):
        x0 = left + gap / 2 + group * group_width
        for number, peer in enumerate(peers):
            value = values.get((workload, peer))
            if value is None or math.isnan(value):
                continue
            h = plot_height * value / top
            x = x0 + number * bar
            parts.append(
                f'<rect x="{x:.1f}" y="{base_y - h:.1f}" width="{bar - 2}" '
                f'height="{h:.1f}" fill="{PALETTE[number % len(PALETTE)]}">'
                f"<title>{escape(peer)} on {escape(workload)}: {value:.0f} ms</title></rect>"
            )
        parts.append(
            f'<text x="{x0 + len(peers) * bar / 2:.1f}" y="{base_y + 18}" '
            f'text-anchor="middle">{escape(workload)}</text>'
        )
    parts.append(f'<line x1="{left}" y1="{base_y}" x2="{width - 180}" y2="{base_y}" stroke="black"/>')
    for number, peer in enumerate(peers):
        y = 50 + number * 20
        parts.append(
            f'<rect x="{width - 170}" y="{y - 10}" width="12" height="12" fill="{PALETTE[number % len(PALETTE)]}"/>'
        )
        parts.append(f'<text x="{width - 152}" y="{y}">{escape(peer)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def write_reports(
    out: Path,
    meta: dict[str, Any],
    runs: list[dict[str, Any]],
    reference_peer: str | None = None,
    more_verdicts: Sequence[Verdict] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Verdict], dict[str, Path]]:
    """Summaries, mismatches, goal verdicts, and the files written: bench.json and ttft.svg in `out`."""
    rows = summarize(runs)
    found = mismatches(runs, reference_peer)
    verdicts = [*goal_verdicts(runs), *more_verdicts]
    out.mkdir(parents=True, exist_ok=True)
    files = {"json": write_json(out / "bench.json", meta, runs, rows, found, verdicts), "svg": out / "ttft.svg"}
    files["svg"].write_text(svg_chart(rows))
    return rows, found, verdicts, files
