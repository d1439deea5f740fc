"""The runner: every peer over the workloads, answers compared, figures and files written (tiny model)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chatapp.benchmark import runner
from chatapp.benchmark.memory import RssSampler
from chatapp.benchmark.peers import PEERS, NoCachePeer, PeerAnswer, PeerSettings
from chatapp.benchmark.remote_peer import ENV_BACKEND_KEY
from chatapp.benchmark.workloads import Request


@pytest.fixture(autouse=True)
def no_llama_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "find_llama_server", lambda explicit: Path(explicit) if explicit else None)


class WrongPeer:
    """A no-cache peer whose third answer is altered: the harness must notice."""

    name = "wrong"

    def __init__(self, settings: PeerSettings, folder: Path) -> None:
        self.inner = NoCachePeer(settings, folder)
        self.asked = 0

    def prepare(self, request: Request) -> dict[str, float] | None:
        return self.inner.prepare(request)

    def settle(self) -> None:
        self.inner.settle()

    def ask(self, prompt_tokens: Sequence[int], max_tokens: int) -> PeerAnswer:
        answer = self.inner.ask(prompt_tokens, max_tokens)
        self.asked += 1
        return replace(answer, text=answer.text + " (altered)") if self.asked == 3 else answer

    def close(self) -> None:
        self.inner.close()


def argv(model: Path, out: Path, peers: str, workloads: str = "A", *extra: str) -> list[str]:
    return [
        "--scale",
        "tiny",
        "--model",
        str(model),
        "--threads",
        "1",
        "--out",
        str(out),
        "--peers",
        peers,
        "--workloads",
        workloads,
        *extra,
    ]


@pytest.mark.slow
def test_end_to_end_chatapp_computes_less_than_no_cache(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert runner.main(argv(tiny_model, tmp_path, "no-cache,llama-prefix,chatapp", "A,E")) == 0
    captured = capsys.readouterr()
    assert "llama-server: skipped (not built" in captured.err
    assert "chatapp" in captured.out
    assert "x no-cache" in captured.out
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["mismatches"] == []
    runs = {(run["peer"], run["workload"]): run for run in saved["runs"]}
    assert set(runs) == {(peer, workload) for peer in ("no-cache", "llama-prefix", "chatapp") for workload in "AE"}
    no_cache, chatapp = runs["no-cache", "A"]["requests"], runs["chatapp", "A"]["requests"]
    assert chatapp[1]["computed_tokens"] < no_cache[1]["computed_tokens"] == no_cache[1]["prompt_tokens"]
    assert [request["text"] for request in chatapp] == [request["text"] for request in no_cache]
    # After the restart, chatapp's disk tier still holds the conversations; llama-prefix starts empty.
    after = [index for index, request in enumerate(runs["chatapp", "E"]["requests"]) if request["after_restart"]]
    first = after[0]
    assert (
        runs["chatapp", "E"]["requests"][first]["computed_tokens"]
        < runs["llama-prefix", "E"]["requests"][first]["computed_tokens"]
    )
    assert runs["chatapp", "E"]["disk_bytes"] > 0
    assert runs["chatapp", "A"]["peak_rss_bytes"] > 0
    summary = {(row["peer"], row["workload"]): row for row in saved["summary"]}
    assert summary["no-cache", "A"]["hit_rate"] == 0
    assert summary["chatapp", "A"]["hit_rate"] > 0
    assert (tmp_path / "ttft.svg").read_text().startswith("<svg")


@pytest.mark.slow
def test_warm_ahead_peers_run_only_where_drafts_exist_and_goals_are_judged(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert runner.main(argv(tiny_model, tmp_path, "no-cache,chatapp,chatapp+warm,ideal", "A,C")) == 0
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "bench.json").read_text())
    ran = {(run["peer"], run["workload"]) for run in saved["runs"]}
    assert ("chatapp+warm", "C") in ran
    assert ("chatapp+warm", "A") not in ran
    assert ("ideal", "A") in ran
    measures = {goal["measure"] for goal in saved["goals"]}
    assert measures == {"TTFT after switching back / ideal", "first question TTFT, warm-ahead / question alone"}
    assert "Goals (ratios from this run)" in out
    assert all(goal["value"] > 0 for goal in saved["goals"])
    warm = next(run for run in saved["runs"] if run["peer"] == "chatapp+warm")
    assert all(request["prepare"]["warm_ahead_ms"] > 0 for request in warm["requests"])


@pytest.mark.slow
def test_the_agent_loop_runs_its_clients_at_once_and_restarts_half_way(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    peers = "chatapp,chatapp-serve,no-cache,ideal"
    assert runner.main(argv(tiny_model, tmp_path, peers, "F", "--allow-mismatch")) == 0
    saved = json.loads((tmp_path / "bench.json").read_text())
    # The server answers as the engine in process, clients at once or not. (llama-cpp-python's
    # streamed text drops a whitespace token the tiny model emits: the same ids, other text.)
    assert not [mismatch for mismatch in saved["mismatches"] if mismatch["peer"] == "chatapp-serve"]
    runs = {run["peer"]: run for run in saved["runs"]}
    assert set(runs) == {"no-cache", "chatapp", "chatapp-serve", "ideal"}
    for run in runs.values():
        requests = run["requests"]
        assert run["clients"] == 2
        assert {request["client"] for request in requests} == {0, 1}
        assert 0 < run["served_s"] <= run["wall_s"]
        restarted = [request["after_restart"] for request in requests]
        assert restarted == sorted(restarted)
        assert 0 < restarted.index(True) < len(requests)
    # No cache computes every prompt; chatapp, before and after its restart, far less.
    no_cache, chatapp = runs["no-cache"]["requests"], runs["chatapp"]["requests"]
    assert all(request["computed_tokens"] == request["prompt_tokens"] for request in no_cache)
    after = [request for request in chatapp if request["after_restart"]]
    assert all(request["computed_tokens"] < request["prompt_tokens"] for request in after)
    # One request at a time for peers that serve one at a time: the wait counts in their TTFT.
    assert any(request["queued_ms"] > 0 for request in no_cache)
    # Every peer is sent the same prompts (the tools make them longer than the scale's context: F gets its own).
    assert len({tuple(request["prompt_tokens"] for request in run["requests"]) for run in runs.values()}) == 1
    assert {run["context"] for run in runs.values()} == {2048}
    for run in runs.values():
        for request in run["requests"]:
            reused = request["prompt_tokens"] - request["computed_tokens"]
            assert request["reused_fraction"] == pytest.approx(reused / request["prompt_tokens"])
    assert all(request["reused_fraction"] > 0.9 for request in after)
    measures = {goal["measure"] for goal in saved["goals"]}
    assert {"TTFT after restart, chatapp / ideal", "TTFT after restart, chatapp-serve / ideal"} <= measures
    for peer in ("chatapp", "chatapp-serve"):
        assert f"least prompt share reused after a client's first request, {peer}" in measures
    out = capsys.readouterr().out
    assert "F: prompt tokens reused per request (reused / prompt)" in out
    assert "after restart: client 2 step 2" in out


@pytest.mark.slow
def test_a_peer_with_other_text_fails_the_run(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(PEERS, "wrong", WrongPeer)
    assert runner.main(argv(tiny_model, tmp_path, "no-cache,wrong")) == 2
    err = capsys.readouterr().err
    assert "FAILED" in err
    assert "peer wrong, workload A, request 3" in err
    assert "(altered)" in err
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert [(item["peer"], item["workload"], item["request"]) for item in saved["mismatches"]] == [("wrong", "A", 2)]


@pytest.mark.slow
def test_allow_mismatch_reports_without_failing(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(PEERS, "wrong", WrongPeer)
    assert runner.main(argv(tiny_model, tmp_path, "no-cache,wrong", "A", "--allow-mismatch")) == 0
    assert "warning: 1 answer(s) differ" in capsys.readouterr().out


def runs_by_peer(out: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    saved = json.loads((out / "bench.json").read_text())
    return saved, {run["peer"]: run for run in saved["runs"]}


def answers_and_work(run: dict[str, Any]) -> list[tuple[str, int, bool]]:
    return [(request["text"], request["computed_tokens"], request["after_restart"]) for request in run["requests"]]


@pytest.mark.slow
def test_chatapp_through_its_remote_engine_in_front_of_chatapp_serve_does_the_same_work(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert runner.main(argv(tiny_model, tmp_path, "chatapp,chatapp-remote", "E")) == 0
    saved, runs = runs_by_peer(tmp_path)
    assert saved["mismatches"] == []
    # The same answers and the same prompt tokens computed, before and after the server's restart.
    assert answers_and_work(runs["chatapp-remote"]) == answers_and_work(runs["chatapp"])
    assert any(request["after_restart"] for request in runs["chatapp-remote"]["requests"])
    assert "restart" not in runs["chatapp-remote"]  # the bench started the server: it restarted it
    goals = {goal["measure"]: goal for goal in saved["goals"]}
    assert goals["median TTFT, chatapp-remote / in-process"]["value"] > 0
    assert goals["requests computing the same tokens, chatapp-remote"]["met"]


@pytest.mark.slow
def test_a_remote_url_peer_uses_a_server_already_running_with_its_key(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.server_support import running_server

    monkeypatch.delenv(ENV_BACKEND_KEY, raising=False)
    with running_server(tmp_path / "server", tiny_model, api_key="sekret", context_cap=512, sequences=2) as server:
        peers = f"chatapp,remote:{server.url}"
        assert runner.main(argv(tiny_model, tmp_path / "keyless", peers, "E")) == 2
        err = capsys.readouterr().err
        assert "refused the API key" in err
        assert f"${ENV_BACKEND_KEY}" in err
        monkeypatch.setenv(ENV_BACKEND_KEY, "sekret")  # also on /chatapp/flush, where settle waits for the store
        assert runner.main(argv(tiny_model, tmp_path / "out", peers, "E")) == 0
    out = capsys.readouterr().out
    saved, runs = runs_by_peer(tmp_path / "out")
    name = f"remote:127.0.0.1:{server.port}"
    assert saved["mismatches"] == []
    assert [request["text"] for request in runs[name]["requests"]] == [
        request["text"] for request in runs["chatapp"]["requests"]
    ]
    assert "not restarted" in runs[name]["restart"]
    assert f"E {name}: reconnected only" in out


def test_a_remote_peer_that_is_not_a_url_is_refused_with_the_fix(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert runner.main(argv(tiny_model, tmp_path, "chatapp,remote:localhost:8080")) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith("chatapp bench: --peers remote:localhost:8080:")
    assert "remote:http://127.0.0.1:8080" in err


def test_unknown_names_are_refused(tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert runner.main(argv(tiny_model, tmp_path, "no-cache,nonsense", "A,Z")) == 2
    err = capsys.readouterr().err
    assert "nonsense" in err
    assert "Z" in err


def test_a_missing_llama_server_binary_is_refused(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert runner.main(argv(tiny_model, tmp_path, "no-cache", "A", "--llama-server", str(tmp_path / "nope"))) == 2
    assert "no such file" in capsys.readouterr().err


def test_rss_sampler_sees_an_allocation() -> None:
    with RssSampler(interval_s=0.001) as rss:
        block = bytearray(64 << 20)
        block[::4096] = b"x" * len(block[::4096])
    # Leaving the block samples once more, with the allocation still alive: no sleep needed.
    assert rss.peak_bytes - rss.start_bytes >= 32 << 20
    del block


@pytest.mark.slow
def test_the_coding_agent_goes_over_anthropics_messages_api_and_is_checked_against_cold_runs(
    tiny_model: Path, tmp_path: Path
) -> None:
    """K: only the servers run it; chatapp serve builds from the messages the prompt the workload built."""
    assert runner.main(argv(tiny_model, tmp_path, "chatapp,chatapp-serve", "K")) == 0
    saved = json.loads((tmp_path / "bench.json").read_text())
    (run,) = saved["runs"]
    assert run["peer"] == "chatapp-serve", "the in-process engine takes prompt tokens, not messages"
    requests = run["requests"]
    assert [request["after_restart"] for request in requests] == [False, True]
    assert requests[1]["computed_tokens"] < requests[1]["prompt_tokens"], "found on disk after the restart"
    assert [check["equal"] for check in run["cold_check"]] == [True]
    assert not saved["mismatches"]
    measures = {goal["measure"] for goal in saved["goals"]}
    assert "answers after restart equal to cold (share)" in measures


@pytest.mark.slow
def test_new_coding_agent_conversations_reuse_their_instructions_and_answer_as_cold(
    tiny_model: Path, tmp_path: Path
) -> None:
    """J: chatapp serve reads Claude Code's bodies back to the prompts the workload built, and a new conversation
    after the sub-agent's request still finds the instructions the first one computed."""
    assert runner.main(argv(tiny_model, tmp_path, "chatapp-serve", "J")) == 0
    saved = json.loads((tmp_path / "bench.json").read_text())
    (run,) = saved["runs"]
    first, sub_agent, second = run["requests"]
    assert sub_agent["label"] == "sub-agent"
    assert first["computed_tokens"] == first["prompt_tokens"]
    assert second["computed_tokens"] <= second["prompt_tokens"] - second["known_prefix"] + 64
    assert [check["equal"] for check in run["cold_check"]] == [True]
    assert not saved["mismatches"]
    assert "answers equal to cold (share)" in {goal["measure"] for goal in saved["goals"]}
