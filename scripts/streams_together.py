"""Several clients streaming at once: aggregate answer tokens per second and TTFT, `chatapp serve`
against llama-server with one slot per client (`-np N`), measured side by side in one run.

Both serve the bundled model on 2 threads. For N = 1..4, N clients each stream a greedy answer to
a question of their own, all sent at once; the figure is every client's answer tokens over the time
from the first request to the last answer's end (the median over rounds), and the clients' median
time to first token. chatapp's after-answer work (each answer's KV recomputed for the cache) is
waited for before the next server's turn. chatapp's answers share one decode per step where the
model batches exactly (batch_rule.py: the bundled Q4_1 does); a second `chatapp serve` with
`batch_answers = false` shows what that brings. Run from the repository root:

    .venv/bin/python scripts/streams_together.py [ROUNDS] [--clients 1,2,3,4] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stream_speed import DEFAULT_SERVER, start_chatapp_serve, stream_answer, wait_up

from chatapp.benchmark.server_process import free_port
from chatapp.model_files import bundled_model_path

ANSWER_TOKENS = 128
QUESTIONS = (
    "Write a story about a lighthouse keeper and the sea.",
    "Explain how a bicycle stays upright, step by step.",
    "Describe a walk through a busy market in the morning.",
    "Tell me about the history of paper and printing.",
)


def stream_one(url: str, model: str, question: str, out: list[tuple[int, float, float]]) -> None:
    """Stream one answer; appends (tokens, first token time, end time)."""
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": ANSWER_TOKENS,
        "temperature": 0,
    }
    tokens, first = stream_answer(url, body)
    out.append((tokens, first, time.perf_counter()))


def together(url: str, model: str, clients: int) -> tuple[float, float]:
    """Aggregate answer tokens per second, and the median time to first token, of `clients` at once."""
    out: list[tuple[int, float, float]] = []
    started = time.perf_counter()
    threads = [
        threading.Thread(target=stream_one, args=(url, model, QUESTIONS[index % len(QUESTIONS)], out))
        for index in range(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ended = max(end for _, _, end in out)
    return sum(tokens for tokens, _, _ in out) / (ended - started), statistics.median(f - started for _, f, _ in out)


def start_llama_server(binary: Path, port: int, slots: int) -> subprocess.Popen[bytes]:
    command = [str(binary), "-m", str(bundled_model_path()), "-t", "2", "-tb", "2", "-c", str(2048 * slots),
               "-np", str(slots), "--port", str(port)]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", type=int, nargs="?", default=3)
    parser.add_argument("--clients", default="1,2,3,4")
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_SERVER)
    args = parser.parse_args()
    counts = [int(part) for part in args.clients.split(",")]
    ours, unbatched = free_port(), free_port()
    with tempfile.TemporaryDirectory() as data, tempfile.TemporaryDirectory() as other:
        chatapps = [start_chatapp_serve(ours, data), start_chatapp_serve(unbatched, other, "batch_answers = false\n")]
        try:
            urls = {"chatapp": f"http://127.0.0.1:{ours}", "chatapp unbatched": f"http://127.0.0.1:{unbatched}"}
            for url in urls.values():
                wait_up(url)
            model_id = httpx.get(f"{urls['chatapp']}/v1/models").json()["data"][0]["id"]
            for clients in counts:
                print(measure(args, urls, model_id, clients), flush=True)
        finally:
            for process in chatapps:
                process.terminate()
                process.wait(timeout=60)


def measure(args: argparse.Namespace, urls: dict[str, str], model_id: str, clients: int) -> str:
    """One line: each server's median aggregate speed and TTFT for `clients` at once, rounds interleaved."""
    theirs = free_port()
    server = start_llama_server(args.llama_server, theirs, clients)
    figures: dict[str, list[tuple[float, float]]] = {who: [] for who in (*urls, "llama-server")}
    try:
        wait_up(f"http://127.0.0.1:{theirs}")
        for _ in range(args.rounds):
            for who, url in urls.items():
                figures[who].append(together(url, model_id, clients))
                httpx.post(f"{url}/chatapp/flush", timeout=600)
            figures["llama-server"].append(together(f"http://127.0.0.1:{theirs}", "m", clients))
    finally:
        server.terminate()
        server.wait(timeout=60)
    speed = {who: statistics.median(value for value, _ in runs) for who, runs in figures.items()}
    ttft = {who: statistics.median(value for _, value in runs) for who, runs in figures.items()}
    parts = [f"{who} {speed[who]:6.1f} tok/s (TTFT {ttft[who]:.2f} s)" for who in figures]
    return (
        f"{clients} client(s): "
        + ", ".join(parts)
        + f"; chatapp/llama-server {speed['chatapp'] / speed['llama-server']:.2f}, "
        f"batched/unbatched {speed['chatapp'] / speed['chatapp unbatched']:.2f}"
    )


if __name__ == "__main__":
    main()
