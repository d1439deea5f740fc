"""The issue's goals, checked against one run's raw results: each a ratio, its target, met or not.

Every ratio compares figures from the same run (the machine is shared and noisy, so only
side-by-side ratios mean anything). A goal whose peers did not run is left out.

- A: after switching persona and back, chatapp's TTFT / the ideal's (prefix live) <= 1.05,
  and / llama-server's <= 1.0.
- B: throughput, no cache's busy time / chatapp's >= 4.
- C warm-ahead: the first question's TTFT with the document warmed / the question alone <= 1.1.
- C typed: TTFT after Enter with type-ahead / the question alone <= 0.3 (same answers: the
  run's equality check).
- D: busy time of the best llama-cpp-python peer / chatapp's >= 3; llama-server's / chatapp's >= 1.5.
- E: after a restart, chatapp's TTFT / the ideal's <= 1.15, and every other peer's / chatapp's >= 8.
- A-E over HTTP: `chatapp serve`'s median TTFT / the in-process chatapp peer's <= 1.1, per workload.
- A, C and E through the remote engine (chatapp in front of a `chatapp serve` the bench started,
  `chatapp-remote`): its median TTFT / the in-process chatapp peer's <= 1.15, every request
  computing the same prompt tokens (the share that does: 1), per workload; the same for
  `chatapp-remote+warm` beside `chatapp+warm` on C. (Equal answers: the run's equality check.)
- F (agent loop, clients at once), for chatapp and for `chatapp serve`: TTFT after the restart /
  the ideal's <= 1.15, llama-server's (restarted cold) / chatapp's >= 5 (the median of every
  request after the restart, and of each client's first after it), requests per minute
  / llama-server's (one slot per client) >= 1, and every request after each client's first,
  after the restart too, reuses >= 0.95 of its prompt tokens (the least such share is judged).
- G (request traces replayed against a RAM budget, no model), per trace variant: the value
  policy's token hit rate / Belady's offline optimum >= 0.9, and / the better of LRU and LFU > 1.
- R (one prefix restored again and again): a RAM restore / llama.cpp loading the same state from a
  ready buffer <= 1.5, a disk restore (page cache warm) / the same <= 2, and a total miss (until the
  engine is idle, storing included) / the same prompt's cost without the cache <= 1.02.
- P (prefill with nothing cached): chatapp's prompt tokens per second / llama-server's, both with
  flash attention (chatapp's exact mode) >= 1, and chatapp's default for one user (`auto`: on where
  its rule finds it pays, from this run's speeds) / llama-server's default (on) >= 1; one stream's
  answer tokens per second, each with its default, chatapp / llama-server >= 0.97.
- N (clients at once over HTTP): three clients' aggregate answer tokens per second, `chatapp serve`
  / llama-server with `-np 3` >= 1; one client alone, chatapp / chatapp with `batch_answers = false`
  >= 0.98 (batching costs a lone stream nothing).

"Busy time" is the sum over requests of the time to the last token plus the time the peer
needed to settle afterwards (model loading left out); "the question alone" is the ideal
peer's TTFT, whose context already holds everything before the question.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from chatapp.benchmark.workloads import BACK

CHATAPP = "chatapp"
WARM = "chatapp+warm"
TYPED = "chatapp+typed"
IDEAL = "ideal"
SERVER = "llama-server"
SERVE = "chatapp-serve"
REMOTE = "chatapp-remote"
REMOTE_WARM = "chatapp-remote+warm"
REMOTE_URL = "remote:"  # peers on a server the bench did not start (restarts only reconnect)
REMOTE_WORKLOADS = "ACE"
LLAMA_CPP_PYTHON = ("no-cache", "llama-prefix", "llama-ram", "llama-disk")


@dataclass(frozen=True)
class Verdict:
    goal: str
    measure: str
    value: float
    target: str
    met: bool

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def busy_s(run: dict[str, Any]) -> float:
    milliseconds: float = sum(request["total_ms"] + request.get("settle_ms", 0.0) for request in run["requests"])
    return milliseconds / 1000


def reused_fraction(request: dict[str, Any]) -> float:
    """The share of a request's prompt tokens the peer reused rather than computed (NaN for no prompt)."""
    prompt: int = request["prompt_tokens"]
    return (prompt - request["computed_tokens"]) / prompt if prompt else math.nan


def later_requests(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Each client's requests after its first (the requests are in the workload's order)."""
    seen: set[int] = set()
    later = []
    for request in run["requests"]:
        client = request.get("client", 0)
        if client in seen:
            later.append(request)
        seen.add(client)
    return later


def _ttft(run: dict[str, Any], chosen: Callable[[int, dict[str, Any]], bool]) -> float:
    return _median([request["ttft_ms"] for index, request in enumerate(run["requests"]) if chosen(index, request)])


def _every(index: int, request: dict[str, Any]) -> bool:
    return True


def first_after_restart(run: dict[str, Any]) -> float:
    """The median TTFT of each client's first request after the restart (F): the one that finds
    what the restart left. The median of every request after it also counts the later ones, which
    every peer answers from what it computed since the restart, and whose TTFT depends on whether
    the clients' requests happen to arrive together."""
    seen: set[int] = set()
    firsts = []
    for request in run["requests"]:
        client = request.get("client", 0)
        if request.get("after_restart") and client not in seen:
            seen.add(client)
            firsts.append(request["ttft_ms"])
    return _median(firsts)


def _at_most(goal: str, measure: str, value: float, limit: float) -> Verdict:
    return Verdict(goal, measure, value, f"<= {limit:g}", value <= limit)


def _at_least(goal: str, measure: str, value: float, limit: float) -> Verdict:
    return Verdict(goal, measure, value, f">= {limit:g}", value >= limit)


def goal_verdicts(runs: Iterable[dict[str, Any]]) -> list[Verdict]:
    by_key = {(run["workload"], run["peer"]): run for run in runs}

    def run_of(workload: str, peer: str) -> dict[str, Any] | None:
        return by_key.get((workload, peer))

    verdicts: list[Verdict] = []

    def back(index: int, request: dict[str, Any]) -> bool:
        return bool(request["label"].startswith(BACK))

    def after_restart(index: int, request: dict[str, Any]) -> bool:
        return bool(request.get("after_restart"))

    def first(index: int, request: dict[str, Any]) -> bool:
        return index == 0

    chatapp, ideal, server = run_of("A", CHATAPP), run_of("A", IDEAL), run_of("A", SERVER)
    if chatapp and ideal:
        verdicts.append(
            _at_most("A", "TTFT after switching back / ideal", _ttft(chatapp, back) / _ttft(ideal, back), 1.05)
        )
    if chatapp and server:
        verdicts.append(
            _at_most("A", "TTFT after switching back / llama-server", _ttft(chatapp, back) / _ttft(server, back), 1.0)
        )

    chatapp, no_cache = run_of("B", CHATAPP), run_of("B", "no-cache")
    if chatapp and no_cache:
        verdicts.append(_at_least("B", "throughput / no cache", busy_s(no_cache) / busy_s(chatapp), 4.0))

    warm, typed, ideal = run_of("C", WARM), run_of("C", TYPED), run_of("C", IDEAL)
    if warm and ideal:
        verdicts.append(
            _at_most(
                "C", "first question TTFT, warm-ahead / question alone", _ttft(warm, first) / _ttft(ideal, first), 1.1
            )
        )
    if typed and ideal:
        verdicts.append(
            _at_most("C", "TTFT after Enter, typed / question alone", _ttft(typed, _every) / _ttft(ideal, _every), 0.3)
        )

    chatapp = run_of("D", CHATAPP)
    llama_runs = [run for name in LLAMA_CPP_PYTHON if (run := run_of("D", name))]
    if chatapp and llama_runs:
        best = min(busy_s(run) for run in llama_runs)
        verdicts.append(_at_least("D", "busy time, best llama-cpp-python peer / chatapp", best / busy_s(chatapp), 3.0))
    server = run_of("D", SERVER)
    if chatapp and server:
        verdicts.append(_at_least("D", "busy time, llama-server / chatapp", busy_s(server) / busy_s(chatapp), 1.5))

    chatapp, ideal = run_of("E", CHATAPP), run_of("E", IDEAL)
    if chatapp and ideal:
        verdicts.append(
            _at_most(
                "E", "TTFT after restart / ideal", _ttft(chatapp, after_restart) / _ttft(ideal, after_restart), 1.15
            )
        )
    others = [
        run
        for (workload, name), run in by_key.items()
        if workload == "E" and name not in (CHATAPP, WARM, TYPED, IDEAL, SERVE) and not _remote(name)
    ]
    if chatapp and others:
        worst_ratio = min(_ttft(run, after_restart) for run in others) / _ttft(chatapp, after_restart)
        verdicts.append(_at_least("E", "TTFT after restart, fastest other peer / chatapp", worst_ratio, 8.0))
    for peer in (CHATAPP, SERVE):
        verdicts += _agent_loop_verdicts(peer, run_of("F", peer), run_of("F", IDEAL), run_of("F", SERVER))
    for workload in "ABCDE":
        chatapp, serve = run_of(workload, CHATAPP), run_of(workload, SERVE)
        if chatapp and serve:
            ratio = _ttft(serve, _every) / _ttft(chatapp, _every)
            verdicts.append(_at_most(workload, "median TTFT over HTTP (chatapp serve) / in-process", ratio, 1.1))
    for in_process, remote in ((CHATAPP, REMOTE), (WARM, REMOTE_WARM)):
        for workload in REMOTE_WORKLOADS:
            verdicts += _remote_verdicts(workload, remote, run_of(workload, in_process), run_of(workload, remote))
    verdicts += _coder_verdicts(run_of("K", SERVE), run_of("K", SERVER))
    verdicts += _new_conversation_verdicts(run_of("J", SERVE), run_of("J", SERVER))
    return verdicts


def _coder_verdicts(serve: dict[str, Any] | None, server: dict[str, Any] | None) -> list[Verdict]:
    """K, a coding agent over Anthropic's Messages API: the median TTFT against llama-server's on its own
    /v1/messages, the first turn after the restart, and the answers after it against cold runs."""
    if serve is None:
        return []
    verdicts = (
        [_cold_share("K", "answers after restart equal to cold (share)", serve)] if serve.get("cold_check") else []
    )
    if server is not None:
        verdicts.append(
            _at_most(
                "K", "median TTFT, chatapp serve / llama-server", _ttft(serve, _every) / _ttft(server, _every), 1.0
            )
        )
        first = first_after_restart(server) / first_after_restart(serve)
        verdicts.append(_at_least("K", "first TTFT after restart, llama-server / chatapp serve", first, 10.0))
    return verdicts


def _new_conversation_verdicts(serve: dict[str, Any] | None, server: dict[str, Any] | None) -> list[Verdict]:
    """J, new coding-agent conversations: the median TTFT of the conversations after the first against
    llama-server's on its own /v1/messages, and the answers checked against cold runs."""
    if serve is None:
        return []
    verdicts = [_cold_share("J", "answers equal to cold (share)", serve)] if serve.get("cold_check") else []
    if server is not None:
        ratio = _ttft(server, _later_conversation) / _ttft(serve, _later_conversation)
        verdicts.append(_at_least("J", "median TTFT of conversations 2-5, llama-server / chatapp serve", ratio, 10.0))
    return verdicts


def _later_conversation(index: int, request: dict[str, Any]) -> bool:
    """A new conversation's first request after the first one (J; the sub-agent's is not one)."""
    label = str(request["label"])
    return label.startswith("conversation") and label != "conversation 1"


def _cold_share(workload: str, measure: str, run: dict[str, Any]) -> Verdict:
    """The share of a run's checked answers equal to the same prompt computed cold (all of them, or a miss)."""
    checks = run["cold_check"]
    return _at_least(workload, measure, sum(1 for check in checks if check["equal"]) / len(checks), 1.0)


def _remote(peer: str) -> bool:
    """chatapp through its remote engine: beside chatapp, not another cache (and not restarted, on a URL)."""
    return peer.startswith((REMOTE, REMOTE_URL))


def _remote_verdicts(
    workload: str, peer: str, in_process: dict[str, Any] | None, remote: dict[str, Any] | None
) -> list[Verdict]:
    """The remote engine's path against the in-process engine's: the same TTFT, give or take, and the same work."""
    if in_process is None or remote is None:
        return []
    ttft = _ttft(remote, _every) / _ttft(in_process, _every)
    pairs = list(zip(in_process["requests"], remote["requests"], strict=False))
    same = sum(mine["computed_tokens"] == theirs["computed_tokens"] for mine, theirs in pairs)
    requests = max(len(in_process["requests"]), len(remote["requests"]))
    return [
        _at_most(workload, f"median TTFT, {peer} / in-process", ttft, 1.15),
        _at_least(workload, f"requests computing the same tokens, {peer}", same / requests if requests else 0.0, 1.0),
    ]


def requests_per_minute(run: dict[str, Any]) -> float:
    """Requests over the time spent serving them (restarts and model loading left out)."""
    served: float = run.get("served_s") or run["wall_s"]
    return len(run["requests"]) / served * 60 if served > 0 else math.nan


def _agent_loop_verdicts(
    peer: str, chatapp: dict[str, Any] | None, ideal: dict[str, Any] | None, server: dict[str, Any] | None
) -> list[Verdict]:
    if chatapp is None:
        return []

    def after_restart(index: int, request: dict[str, Any]) -> bool:
        return bool(request.get("after_restart"))

    verdicts = []
    later = [reused_fraction(request) for request in later_requests(chatapp)]
    if later:
        measure = f"least prompt share reused after a client's first request, {peer}"
        verdicts.append(_at_least("F", measure, min(later), REUSED_AFTER_FIRST))
    mine = _ttft(chatapp, after_restart)
    if ideal:
        verdicts.append(_at_most("F", f"TTFT after restart, {peer} / ideal", mine / _ttft(ideal, after_restart), 1.15))
    if server:
        verdicts.append(
            _at_least("F", f"TTFT after restart, llama-server / {peer}", _ttft(server, after_restart) / mine, 5.0)
        )
        first = first_after_restart(server) / first_after_restart(chatapp)
        verdicts.append(_at_least("F", f"each client's first TTFT after restart, llama-server / {peer}", first, 5.0))
        verdicts.append(
            _at_least(
                "F",
                f"requests per minute, {peer} / llama-server",
                requests_per_minute(chatapp) / requests_per_minute(server),
                1.0,
            )
        )
    return verdicts


REUSED_AFTER_FIRST = 0.95  # F: each client's later requests, the restart included
VALUE_OF_BELADY = 0.9  # G: the value policy's token hit rate at least this share of Belady's


def trace_verdicts(hit_rates: Mapping[str, Mapping[str, float]]) -> list[Verdict]:
    """G's goals from token hit rates by trace variant, then policy ("value", "lru", "lfu", "belady")."""
    verdicts = []
    for variant, rates in hit_rates.items():
        value = rates["value"]
        verdicts.append(
            _at_least("G", f"{variant}: token hit rate, value / Belady", value / rates["belady"], VALUE_OF_BELADY)
        )
        best_online = max(rates["lru"], rates["lfu"])
        ratio = value / best_online if best_online else math.inf
        verdicts.append(Verdict("G", f"{variant}: token hit rate, value / best of LRU, LFU", ratio, "> 1", ratio > 1))
    return verdicts


def restore_verdicts(
    *, ram: float, ram_blocks: float, disk: float, disk_cold: float | None, miss: float
) -> list[Verdict]:
    """R's goals from its ratios (see restore_figure.py); `disk_cold` is None where the page cache
    cannot be dropped for a file (no posix_fadvise)."""
    verdicts = [
        _at_most("R", "RAM restore (whole state) / llama.cpp load, ready", ram, 1.5),
        _at_most("R", "RAM restore from blocks / the same", ram_blocks, 1.3),
        _at_most("R", "disk restore (page cache warm) / the same", disk, 1.5),
    ]
    if disk_cold is not None:
        verdicts.append(
            _at_most("R", "disk restore (page cache cold) / reading its bytes sequentially", disk_cold, 1.3)
        )
    return [*verdicts, _at_most("R", "total miss / no cache (until idle)", miss, 1.02)]


def large_state_verdicts(
    *, peaks: list[float], cold: float | None, warm: float | None, decode: float, equal: bool
) -> list[Verdict]:
    """W's goals (see large_state_figure.py): `peaks` in states over the prompt's with no cache, storing run first."""
    verdicts = [_at_most("W", "peak RSS over computing with no cache, in states (worst step)", max(peaks), 1.25)]
    if cold is not None:
        verdicts.append(_at_most("W", "disk restore (page cache cold) / reading its bytes from one file", cold, 1.3))
    if warm is not None:
        verdicts.append(_at_most("W", "disk restore (page cache warm) / llama.cpp's load plus a warm read", warm, 1.3))
    return [
        *verdicts,
        _at_least("W", "decode tok/s while a large state is stored / idle", decode, 0.9),
        _at_least("W", "restored answers equal to cold (1: all)", float(equal), 1.0),
    ]


def prefill_verdicts(*, default: float, flash: float) -> list[Verdict]:
    """P's goals from its ratios (see prefill_figure.py)."""
    return [
        _at_least("P", "prefill tokens/s, chatapp / llama-server, flash attn", flash, 1.0),
        _at_least("P", "prefill tok/s, default chatapp / default llama-server", default, 1.0),
    ]


def decode_verdict(ratio: float) -> Verdict:
    """Issue 22's one-stream goal, in process: answer tokens per second at least 0.97x llama-server's."""
    return _at_least("P", "decode tok/s of one stream, default chatapp / default llama-server", ratio, 0.97)


STREAMS_TOGETHER = 3  # N: the clients whose aggregate speed is judged against llama-server's
ALONE_UNCHANGED = 0.98  # N: one client, batched / unbatched


def streams_verdicts(
    by_clients: Mapping[int, Mapping[str, Any]], batched: str, unbatched: str, server: str
) -> list[Verdict]:
    """N's goals from its figures by client count, then side (see streams_figure.py)."""
    verdicts = []
    three = by_clients.get(STREAMS_TOGETHER, {})
    if batched in three and server in three:
        ratio = three[batched].answer_tokens_per_s / three[server].answer_tokens_per_s
        verdicts.append(_at_least("N", f"answer tok/s, {STREAMS_TOGETHER} clients, chatapp / llama-server", ratio, 1.0))
    one = by_clients.get(1, {})
    if batched in one and unbatched in one:
        ratio = one[batched].answer_tokens_per_s / one[unbatched].answer_tokens_per_s
        verdicts.append(_at_least("N", "answer tok/s, 1 client, batched / unbatched", ratio, ALONE_UNCHANGED))
    return verdicts


def goals_table(verdicts: list[Verdict]) -> str:
    lines = ["Goals (ratios from this run)"]
    width = max([52, *(len(verdict.measure) for verdict in verdicts)])
    for verdict in verdicts:
        lines.append(
            f"  {verdict.goal}  {verdict.measure:{width}} {verdict.value:7.3f}  {verdict.target:7}  "
            f"{'met' if verdict.met else 'MISSED'}"
        )
    return "\n".join(lines)
