"""Figure N: several clients chatting at once, `chatapp serve` beside llama-server with one slot per client.

For N clients (1..4), N greedy answers to questions of their own are asked at once, over HTTP,
of `chatapp serve` (answers batched where the model is exact batched: batch_rule.py), of a second
`chatapp serve` with `batch_answers = false` (what batching brings), and of llama-server started
with `-np N`; rounds interleave the three (each goes first in turn), every server first answers
one question off the clock, and chatapp's after-answer work is waited for off the clock. Per
side: requests per minute, aggregate answer tokens per second (every client's answer tokens
over the time from sending to the last answer's end), TTFT median and p95.

Beside it, in process: what computing several requests' prompts in one llama.cpp batch costs
against computing them one after another (three sequences that each hold a long context, the
same new tokens each). On a CPU the two cost about the same, so batching prompts would only
delay the first request's first token to the last one's; the engine computes prompts one at a
time, shortest remaining first (turns.py), and batches only answers.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, closing
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from chatapp.benchmark.goals import Verdict, streams_verdicts
from chatapp.benchmark.llama_server import uncached_server
from chatapp.benchmark.peers import Peer, PeerAnswer, PeerSettings
from chatapp.benchmark.serve_peer import ChatappServePeer
from chatapp.benchmark.workloads import PromptKit
from chatapp.engine.opening import PROMPTS_TOGETHER, prompts_together_ratio
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import Role

STREAMS_NAME = "N"
BATCHED, UNBATCHED, SERVER = "chatapp", "chatapp unbatched", "llama-server"
QUESTIONS = (
    "Write a story about a lighthouse keeper and the sea.",
    "Explain how a bicycle stays upright, step by step.",
    "Describe a walk through a busy market in the morning.",
    "Tell me about the history of paper and printing.",
)
WARM_UP = "Say hello."


@dataclass(frozen=True)
class SideFigures:
    """One side's figures for N clients, over every round."""

    requests_per_minute: float
    answer_tokens_per_s: float  # the median round's aggregate
    ttft_median_ms: float
    ttft_p95_ms: float


@dataclass(frozen=True)
class StreamsFigures:
    answer_tokens: int  # asked of every request
    rounds: int
    by_clients: dict[int, dict[str, SideFigures]]  # clients -> side -> figures
    prompt_context: int  # tokens each sequence held before the prompts measured together
    prompt_tokens: int  # new tokens of each of PROMPTS_TOGETHER prompts
    prompts_together_ratio: float  # one decode of them all / one after another (median of rounds)
    elapsed_s: float


@dataclass
class _Round:
    answers: list[PeerAnswer]
    wall_s: float


def measure_streams(
    settings: PeerSettings,
    kit: PromptKit,
    server: Path | None,
    folder: Path,
    *,
    clients: tuple[int, ...],
    rounds: int,
    answer_tokens: int,
    prompt_context: int,
    log: Callable[[str], None] = lambda message: None,
) -> StreamsFigures:
    """Figure N (see the module docstring); llama-server's side only when it is built."""
    started = time.perf_counter()
    most = max(clients)
    shaped = replace(settings, chatapp_sequences=most + 1)
    by_clients: dict[int, dict[str, SideFigures]] = {}
    with ExitStack() as stack:
        chatapps: dict[str, Peer] = {
            BATCHED: stack.enter_context(closing(ChatappServePeer(shaped, folder / "batched"))),
            UNBATCHED: stack.enter_context(
                closing(ChatappServePeer(shaped, folder / "unbatched", batch_answers=False))
            ),
        }
        for count in clients:
            with ExitStack() as this_count:
                sides: dict[str, Peer] = dict(chatapps)
                if server is not None:  # started with one slot per client
                    sides[SERVER] = this_count.enter_context(closing(uncached_server(settings, server, slots=count)))
                for peer in sides.values():  # off the clock: a server's first request pays its first-use costs
                    peer.ask(kit.build([ChatMessage.of(Role.USER, WARM_UP)]), 8)
                    peer.settle()
                runs: dict[str, list[_Round]] = {side: [] for side in sides}
                for number in range(rounds):
                    prompts = [_question(kit, client, count, number) for client in range(count)]
                    order = list(sides)
                    for side in order[number % len(order) :] + order[: number % len(order)]:  # each goes first in turn
                        runs[side].append(_together(sides[side], prompts, answer_tokens))
                        sides[side].settle()
            by_clients[count] = {side: _side_figures(side_runs) for side, side_runs in runs.items()}
            speeds = ", ".join(f"{side} {figure.answer_tokens_per_s:.1f}" for side, figure in by_clients[count].items())
            log(f"{STREAMS_NAME} {count} client(s) at once: answer tokens/s {speeds}")
    prompt_tokens = max(16, min(160, prompt_context // 8))
    ratio = prompts_together_ratio(
        settings.model_path,
        threads=settings.threads,
        n_batch=settings.n_batch,
        held=prompt_context,
        new_tokens=prompt_tokens,
        rounds=rounds,
    )
    return StreamsFigures(
        answer_tokens, rounds, by_clients, prompt_context, prompt_tokens, ratio, time.perf_counter() - started
    )


def _question(kit: PromptKit, client: int, count: int, number: int) -> tuple[int, ...]:
    """Each client's own question, new in each round and client count: no side answers from a cached
    prompt (the chatapp servers live through every count; llama-server starts again for each)."""
    question = QUESTIONS[client % len(QUESTIONS)]
    return kit.build([ChatMessage.of(Role.USER, f"{question} (Take {count}.{number + 1}.)")])


def _together(peer: Peer, prompts: list[tuple[int, ...]], answer_tokens: int) -> _Round:
    """Ask every prompt at once, one thread per client; the answers and the time to the last one's end."""
    answers: list[PeerAnswer | None] = [None] * len(prompts)
    failures: list[BaseException] = []

    def client(index: int) -> None:
        try:
            answers[index] = peer.ask(prompts[index], answer_tokens)
        except BaseException as error:  # reported on the bench's thread
            failures.append(error)

    threads = [threading.Thread(target=client, args=(index,)) for index in range(len(prompts))]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall_s = time.perf_counter() - started
    if failures:
        raise failures[0]
    return _Round([answer for answer in answers if answer is not None], wall_s)


def _side_figures(runs: list[_Round]) -> SideFigures:
    ttfts = sorted(answer.ttft_ms for run in runs for answer in run.answers)
    speeds = [sum(answer.answer_tokens or 0 for answer in run.answers) / run.wall_s for run in runs]
    requests = sum(len(run.answers) for run in runs)
    return SideFigures(
        requests_per_minute=requests / sum(run.wall_s for run in runs) * 60,
        answer_tokens_per_s=statistics.median(speeds),
        ttft_median_ms=statistics.median(ttfts),
        ttft_p95_ms=ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))],
    )


def streams_figure_verdicts(figures: StreamsFigures | None) -> list[Verdict]:
    if figures is None:
        return []
    return streams_verdicts(figures.by_clients, BATCHED, UNBATCHED, SERVER)


def streams_record(figures: StreamsFigures) -> dict[str, Any]:
    """For bench.json."""
    record = asdict(figures)
    record["by_clients"] = {
        str(count): {side: asdict(figure) for side, figure in sides.items()}
        for count, sides in figures.by_clients.items()
    }
    return record


def streams_table(figures: StreamsFigures) -> str:
    lines = [
        f"N  clients at once over HTTP, {figures.answer_tokens}-token greedy answers, {figures.rounds} rounds "
        f"({figures.elapsed_s:.0f} s): requests/min, answer tokens/s (all clients), TTFT median / p95 ms",
        f"   {'clients':>7}  {'side':<18} {'req/min':>8} {'tok/s':>7} {'TTFT med':>9} {'p95':>7}",
    ]
    for count, sides in figures.by_clients.items():
        for side, figure in sides.items():
            lines.append(
                f"   {count:>7}  {side:<18} {figure.requests_per_minute:8.1f} {figure.answer_tokens_per_s:7.1f} "
                f"{figure.ttft_median_ms:9.0f} {figure.ttft_p95_ms:7.0f}"
            )
    lines.append(
        f"N  {PROMPTS_TOGETHER} prompts of {figures.prompt_tokens} new tokens after {figures.prompt_context:,} held, "
        f"in one decode / one after another: {figures.prompts_together_ratio:.2f} (in process)"
    )
    return "\n".join(lines)
