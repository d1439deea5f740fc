"""Several clients streaming at once: aggregate answer tokens per second and TTFT, `chatapp serve`
against llama-server with one slot per client (`-np N`), measured side by side in one run.

Both serve the bundled model on 2 threads. For N = 1..4, N clients each stream a greedy answer to
a question of their own, all sent at once; the figure is every client's answer tokens over the time
from the first request to the last answer's end (the median over rounds), and the clients' median
time to first token. chatapp's after-answer work (each answer's KV recomputed for the cache) is
waited for before llama-server's turn. chatapp's answers share one decode per step where the
model batches exactly (batch_rule.py: the bundled Q4_1 does). Run from the repository root:

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
    ours = free_port()
    with tempfile.TemporaryDirectory() as data:
        chatapp = start_chatapp_serve(ours, data)
        try:
            ours_url = f"http://127.0.0.1:{ours}"
            wait_up(ours_url)
            model_id = httpx.get(f"{ours_url}/v1/models").json()["data"][0]["id"]
            for clients in counts:
                theirs = free_port()
                server = start_llama_server(args.llama_server, theirs, clients)
                try:
                    theirs_url = f"http://127.0.0.1:{theirs}"
                    wait_up(theirs_url)
                    figures: dict[str, list[tuple[float, float]]] = {"chatapp": [], "llama-server": []}
                    for _ in range(args.rounds):
                        figures["chatapp"].append(together(ours_url, model_id, clients))
                        httpx.post(f"{ours_url}/chatapp/flush", timeout=600)
                        figures["llama-server"].append(together(theirs_url, "m", clients))
                finally:
                    server.terminate()
                    server.wait(timeout=60)
                mine, yours = (statistics.median(speed for speed, _ in figures[who]) for who in figures)
                my_ttft, your_ttft = (statistics.median(ttft for _, ttft in figures[who]) for who in figures)
                print(
                    f"{clients} client(s): chatapp serve {mine:6.1f} tok/s (TTFT {my_ttft:.2f} s)  "
                    f"llama-server -np {clients} {yours:6.1f} tok/s (TTFT {your_ttft:.2f} s)  ratio {mine / yours:.2f}"
                )
        finally:
            chatapp.terminate()
            chatapp.wait(timeout=60)


if __name__ == "__main__":
    main()
