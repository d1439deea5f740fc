"""The report's arithmetic on known numbers, and its files (JSON, SVG) parse."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from chatapp.benchmark.report import (
    mismatches,
    percentile,
    reuse_table,
    summarize,
    svg_chart,
    table,
    write_reports,
)


def request(ttft: float, computed: int, prompt: int = 100, text: str = "ok") -> dict[str, Any]:
    return {
        "label": "q",
        "ttft_ms": ttft,
        "total_ms": ttft + 10,
        "prompt_tokens": prompt,
        "computed_tokens": computed,
        "text": text,
    }


def run(
    peer: str, workload: str, ttfts: list[float], computed: list[int], texts: list[str] | None = None
) -> dict[str, Any]:
    texts = texts or ["ok"] * len(ttfts)
    return {
        "peer": peer,
        "workload": workload,
        "wall_s": 1.5,
        "peak_rss_bytes": 200 << 20,
        "start_rss_bytes": 100 << 20,
        "disk_bytes": 3 << 20,
        "requests": [request(t, c, text=x) for t, c, x in zip(ttfts, computed, texts, strict=True)],
    }


def title_text(element: ET.Element) -> str:
    """The text of an SVG element's <title> child."""
    title = element.find("{http://www.w3.org/2000/svg}title")
    assert title is not None
    assert title.text is not None
    return title.text


def test_percentile_interpolates_between_ranks() -> None:
    values = [float(v) for v in range(1, 21)]  # 1..20
    assert percentile(values, 95) == pytest.approx(19.05)
    assert percentile(values, 50) == pytest.approx(10.5)
    assert percentile([7.0], 95) == 7.0
    assert percentile([10.0, 20.0], 95) == pytest.approx(19.5)
    assert math.isnan(percentile([], 95))


def test_summary_medians_hit_rates_and_ratios() -> None:
    runs = [
        run("no-cache", "A", [100, 300, 200], [100, 100, 100]),
        run("llama-prefix", "A", [100, 50, 40], [100, 20, 10]),
        run("chatapp", "A", [90, 10, 30], [100, 10, 10]),
    ]
    rows = {row["peer"]: row for row in summarize(runs)}
    assert rows["no-cache"]["ttft_median_ms"] == 200
    assert rows["no-cache"]["ttft_p95_ms"] == pytest.approx(290)
    assert rows["no-cache"]["hit_rate"] == 0
    assert rows["chatapp"]["ttft_median_ms"] == 30
    assert rows["chatapp"]["computed_tokens"] == 120
    assert rows["chatapp"]["hit_rate"] == pytest.approx(1 - 120 / 300)
    assert rows["chatapp"]["ttft_vs_no_cache"] == pytest.approx(30 / 200)
    assert rows["chatapp"]["computed_vs_no_cache"] == pytest.approx(120 / 300)
    assert rows["chatapp"]["best_other_peer"] == "llama-prefix"
    assert rows["chatapp"]["ttft_vs_best_other"] == pytest.approx(30 / 50)
    assert rows["llama-prefix"]["best_other_peer"] == "chatapp"
    assert rows["llama-prefix"]["ttft_vs_best_other"] == pytest.approx(50 / 30)
    assert rows["no-cache"]["ttft_vs_no_cache"] == 1


def test_ratios_are_per_workload_and_nan_without_a_baseline() -> None:
    runs = [run("no-cache", "A", [100], [100]), run("chatapp", "A", [10], [10]), run("chatapp", "B", [20], [20])]
    rows = summarize(runs)
    b = next(row for row in rows if row["workload"] == "B")
    assert math.isnan(b["ttft_vs_no_cache"])
    assert math.isnan(b["ttft_vs_best_other"])
    assert "chatapp" in table(rows)


def test_mismatches_name_peer_workload_and_request() -> None:
    runs = [
        run("no-cache", "A", [1, 1], [1, 1], ["a", "b"]),
        run("chatapp", "A", [1, 1], [1, 1], ["a", "B!"]),
        run("llama-ram", "A", [1, 1], [1, 1], ["a", "b"]),
    ]
    found = mismatches(runs)
    assert [(item["peer"], item["workload"], item["request"]) for item in found] == [("chatapp", "A", 1)]
    assert found[0]["expected"] == "b"
    assert found[0]["got"] == "B!"


def test_json_and_svg_are_written_and_parse(tmp_path: Path) -> None:
    runs = [
        run("no-cache", "A", [100, 200], [100, 100]),
        run("chatapp", "A", [20, 30], [100, 10]),
        run("no-cache", "C", [300, 300], [100, 100]),
        run("chatapp", "C", [10, 5], [100, 1]),
    ]
    _rows, _found, _verdicts, files = write_reports(tmp_path, {"scale": "test"}, runs)
    saved = json.loads(files["json"].read_text())
    assert saved["meta"] == {"scale": "test"}
    assert len(saved["summary"]) == 4
    assert saved["mismatches"] == []
    assert len(saved["runs"]) == 4
    root = ET.fromstring(files["svg"].read_text())
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    bars = [
        rect
        for rect in root.iter("{http://www.w3.org/2000/svg}rect")
        if rect.find("{http://www.w3.org/2000/svg}title") is not None
    ]
    assert len(bars) == 4  # one per peer and workload
    heights = {title_text(bar).split(":")[0]: float(bar.attrib["height"]) for bar in bars}
    assert heights["no-cache on C"] == pytest.approx(300)  # the tallest bar fills the plot
    assert heights["no-cache on A"] == pytest.approx(150)


def test_svg_escapes_names() -> None:
    runs = [run("a<b&c", "A", [1], [1])]
    ET.fromstring(svg_chart(summarize(runs)))


def test_the_reuse_table_has_a_row_per_request_and_a_column_per_peer() -> None:
    runs = [run("chatapp", "F", [1, 1, 1], [100, 4, 3]), run("no-cache", "F", [1, 1, 1], [100, 100, 100])]
    for index, request in enumerate(runs[0]["requests"]):
        request["label"] = f"client 1 step {index + 1}"
    runs.append(run("chatapp", "A", [1], [50]))
    lines = reuse_table(runs, "F").splitlines()
    assert lines[0] == "F: prompt tokens reused per request (reused / prompt)"
    assert lines[1].split() == ["request", "prompt", "chatapp", "no-cache"]
    assert [line.split()[-4:] for line in lines[2:]] == [
        ["1", "100", "0.000", "0.000"],
        ["2", "100", "0.960", "0.000"],
        ["3", "100", "0.970", "0.000"],
    ]
    assert reuse_table(runs, "E") == ""
