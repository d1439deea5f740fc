"""Goal verdicts are the right ratios of the right requests (made-up runs)."""

from __future__ import annotations

from typing import Any

import pytest

from chatapp.benchmark.goals import busy_s, goal_verdicts, goals_table, later_requests


def run(
    workload: str,
    peer: str,
    ttfts: list[float],
    labels: list[str] | None = None,
    *,
    total_ms: float = 100.0,
    after_restart: int | None = None,
) -> dict[str, Any]:
    labels = labels or [f"q{index}" for index in range(len(ttfts))]
    return {
        "workload": workload,
        "peer": peer,
        "requests": [
            {
                "label": label,
                "ttft_ms": ttft,
                "total_ms": total_ms,
                "settle_ms": 10.0,
                "after_restart": after_restart is not None and index >= after_restart,
            }
            for index, (label, ttft) in enumerate(zip(labels, ttfts, strict=True))
        ],
    }


def verdicts_by_measure(runs: list[dict[str, Any]]) -> dict[str, tuple[float, bool]]:
    return {f"{v.goal} {v.measure}": (v.value, v.met) for v in goal_verdicts(runs)}


def test_a_uses_only_the_requests_after_switching_back() -> None:
    labels = ["P1 q1", "P1 q2", "back: P1 q3", "back: P2 q4", "back: P1 q5"]
    runs = [
        run("A", "chatapp", [900, 5, 110, 120, 130], labels),
        run("A", "ideal", [800, 1, 100, 100, 100], labels),
        run("A", "llama-server", [700, 1, 130, 130, 130], labels),
    ]
    found = verdicts_by_measure(runs)
    assert found["A TTFT after switching back / ideal"] == pytest.approx((1.2, False))
    assert found["A TTFT after switching back / llama-server"] == pytest.approx((120 / 130, True))


def test_b_and_d_compare_busy_time() -> None:
    runs = [
        run("B", "no-cache", [1, 1], total_ms=990.0),
        run("B", "chatapp", [1, 1], total_ms=290.0),
        run("D", "llama-ram", [1], total_ms=640.0),
        run("D", "no-cache", [1], total_ms=990.0),
        run("D", "chatapp", [1], total_ms=190.0),
        run("D", "llama-server", [1], total_ms=250.0),
    ]
    assert busy_s(runs[0]) == pytest.approx(2.0)  # time to the last token plus settling, over requests
    found = verdicts_by_measure(runs)
    assert found["B throughput / no cache"] == pytest.approx((2.0 / 0.6, False))
    assert found["D busy time, best llama-cpp-python peer / chatapp"] == pytest.approx((0.65 / 0.2, True))
    assert found["D busy time, llama-server / chatapp"] == pytest.approx((0.26 / 0.2, False))


def test_c_warm_ahead_uses_the_first_question_and_typed_every_one() -> None:
    runs = [
        run("C", "chatapp+warm", [105, 500, 500]),
        run("C", "chatapp+typed", [30, 31, 90]),
        run("C", "ideal", [100, 100, 100]),
    ]
    found = verdicts_by_measure(runs)
    assert found["C first question TTFT, warm-ahead / question alone"] == pytest.approx((1.05, True))
    assert found["C TTFT after Enter, typed / question alone"] == pytest.approx((0.31, False))


def test_e_compares_only_requests_after_the_restart_and_every_other_peer() -> None:
    runs = [
        run("E", "chatapp", [900, 100, 110], after_restart=1),
        run("E", "ideal", [900, 100, 100], after_restart=1),
        run("E", "llama-disk", [1, 840, 840], after_restart=1),
        run("E", "no-cache", [1, 2000, 2000], after_restart=1),
    ]
    found = verdicts_by_measure(runs)
    assert found["E TTFT after restart / ideal"] == pytest.approx((1.05, True))
    assert found["E TTFT after restart, fastest other peer / chatapp"] == pytest.approx((8.0, True))


def test_goals_whose_peers_did_not_run_are_left_out() -> None:
    assert goal_verdicts([run("A", "chatapp", [1.0])]) == []
    table = goals_table(
        goal_verdicts([run("B", "no-cache", [1], total_ms=90.0), run("B", "chatapp", [1], total_ms=90.0)])
    )
    assert "B" in table
    assert "MISSED" in table


def test_the_remote_engine_is_judged_against_the_in_process_peer_on_a_c_and_e() -> None:
    def computed(run_: dict[str, Any], tokens: list[int]) -> dict[str, Any]:
        for request, count in zip(run_["requests"], tokens, strict=True):
            request["computed_tokens"] = count
        return run_

    runs = [
        computed(run("A", "chatapp", [100, 200, 300]), [50, 5, 5]),
        computed(run("A", "chatapp-remote", [110, 220, 300]), [50, 5, 5]),
        computed(run("E", "chatapp", [100, 100], after_restart=1), [50, 5]),
        computed(run("E", "chatapp-remote", [130, 130], after_restart=1), [50, 9]),
        computed(run("E", "no-cache", [1000, 1000], after_restart=1), [50, 50]),
        computed(run("E", "remote:gpu-box:8080", [1, 1], after_restart=1), [50, 5]),
        computed(run("B", "chatapp", [100]), [5]),
        computed(run("B", "chatapp-remote", [900]), [5]),
    ]
    found = verdicts_by_measure(runs)
    assert found["A median TTFT, chatapp-remote / in-process"] == pytest.approx((1.1, True))
    assert found["A requests computing the same tokens, chatapp-remote"] == pytest.approx((1.0, True))
    assert found["E median TTFT, chatapp-remote / in-process"] == pytest.approx((1.3, False))
    assert found["E requests computing the same tokens, chatapp-remote"] == pytest.approx((0.5, False))
    assert not [measure for measure in found if measure.startswith("B") and "remote" in measure]
    # A server the bench did not restart is no other cache after a restart.
    assert found["E TTFT after restart, fastest other peer / chatapp"] == pytest.approx((10.0, True))


def agent_run(peer: str, computed: list[int], prompt: int = 1000, clients: int = 2, restart: int = 2) -> dict[str, Any]:
    """An F run: the clients' requests in turn (client 0, client 1, client 0...), restarted at `restart`."""
    made = run("F", peer, [100.0] * len(computed), after_restart=restart)
    for index, (request, count) in enumerate(zip(made["requests"], computed, strict=True)):
        request.update(client=index % clients, prompt_tokens=prompt, computed_tokens=count)
    return made


def test_f_judges_the_least_share_reused_after_each_clients_first_request_restart_included() -> None:
    # Each client's first request computes much (left out); after it, the worst is 60 tokens of 1,000.
    runs = [agent_run("chatapp", [1000, 900, 30, 20, 60, 40]), agent_run("chatapp-serve", [1000, 900, 30, 20, 30, 30])]
    assert [request["computed_tokens"] for request in later_requests(runs[0])] == [30, 20, 60, 40]
    found = verdicts_by_measure(runs)
    chatapp = found["F least prompt share reused after a client's first request, chatapp"]
    assert chatapp == pytest.approx((0.94, False))  # the request after the restart falls short
    serve = found["F least prompt share reused after a client's first request, chatapp-serve"]
    assert serve == pytest.approx((0.97, True))
    assert not [measure for measure in found if "ideal" in measure or "llama-server" in measure]


def test_f_judges_each_clients_first_request_after_the_restart_beside_the_median_of_all() -> None:
    # Two clients, restarted before the third request: clients 0 and 1 each ask once more, then again.
    chatapp = agent_run("chatapp", [1000, 30, 20, 20, 20, 20])
    server = agent_run("llama-server", [1000, 1000, 900, 900, 20, 20])
    for made, ttfts in ((chatapp, [9000, 500, 400, 800, 900, 1300]), (server, [9000, 9000, 6000, 7000, 300, 400])):
        for request, ttft in zip(made["requests"], ttfts, strict=True):
            request["ttft_ms"] = float(ttft)
        made["served_s"] = 60.0
    found = verdicts_by_measure([chatapp, server])
    # After the restart: chatapp 400, 800 (each client's first), 900, 1300; the server 6000, 7000, 300, 400.
    assert found["F TTFT after restart, llama-server / chatapp"] == pytest.approx((3200 / 850, False))
    assert found["F each client's first TTFT after restart, llama-server / chatapp"] == pytest.approx(
        (6500 / 600, True)
    )


def test_j_judges_the_later_conversations_first_requests_and_leaves_the_sub_agent_out() -> None:
    labels = ["conversation 1", "conversation 2", "sub-agent", "conversation 3", "conversation 4"]
    serve = run("J", "chatapp-serve", [900, 10, 500, 20, 30], labels)
    serve["cold_check"] = [{"equal": True}, {"equal": False}]
    server = run("J", "llama-server", [950, 900, 5, 150, 1000], labels)
    found = verdicts_by_measure([serve, server])
    assert found["J median TTFT of conversations 2-5, llama-server / chatapp serve"] == pytest.approx((900 / 20, True))
    assert found["J answers equal to cold (share)"] == pytest.approx((0.5, False))
