"""One stream over HTTP: answer tokens per second from `chatapp serve` and from llama-server, side by side.

Both serve the bundled model on 2 threads; requests alternate between them, whole answers and
streamed (tokens after the first over the time after the first), and chatapp's after-answer work
(the answer's KV recomputed for the cache) is waited for before llama-server's turn, so neither
runs beside the other. Run from the repository root (llama-server built by `chatapp bench`):

    .venv/bin/python scripts/stream_speed.py [ROUNDS] [--llama-server PATH] [--flash-attention on|off]

Each with its default flash attention unless `--flash-attention` sets both (chatapp's is off,
llama-server's `auto`, on for this CPU): one stream's decode depends on it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chatapp.benchmark.server_process import free_port
from chatapp.model_files import bundled_model_path

ANSWER_TOKENS = 300
MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}]
DEFAULT_SERVER = Path.home() / ".cache" / "chatapp" / "llama-server" / "0.3.36" / "llama-server"


def stream_answer(url: str, body: dict[str, object]) -> tuple[int, float]:
    """Stream one chat completion: its answer tokens and when the first text came (perf_counter)."""
    first, tokens = None, 0
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.Client(timeout=600) as client, client.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter()
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    assert first is not None, "no answer text came"
    return tokens, first


def speed(url: str, model: str, stream: bool) -> float:
    body: dict[str, object] = {"model": model, "messages": MESSAGES, "max_tokens": ANSWER_TOKENS, "temperature": 0}
    started = time.perf_counter()
    if not stream:
        with httpx.Client(timeout=600) as client:
            tokens = int(client.post(f"{url}/v1/chat/completions", json=body).json()["usage"]["completion_tokens"])
        return tokens / (time.perf_counter() - started)
    tokens, first = stream_answer(url, body)
    return (tokens - 1) / (time.perf_counter() - first)


def wait_up(url: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not start")


def start_chatapp_serve(port: int, data: str, settings: str = "") -> subprocess.Popen[bytes]:
    """`chatapp serve` on the bundled model and 2 threads, with its own data folder (and `settings`, TOML)."""
    if settings:
        Path(data, "config.toml").write_text(settings, encoding="utf-8")
    return subprocess.Popen(
        [sys.executable, "-m", "chatapp", "serve", "--port", str(port), "--threads", "2", "--context", "2048"],
        env={"CHATAPP_HOME": data, "PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", type=int, nargs="?", default=4)
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_SERVER)
    parser.add_argument("--flash-attention", choices=("on", "off"), help="the same setting for both servers")
    args = parser.parse_args()
    flash = args.flash_attention
    settings = f"flash_attention = {'true' if flash == 'on' else 'false'}\n" if flash else ""
    flash_option = ["-fa", flash] if flash else []
    model = bundled_model_path()
    ours, theirs = free_port(), free_port()
    with tempfile.TemporaryDirectory() as data:
        chatapp = start_chatapp_serve(ours, data, settings)
        server = subprocess.Popen(
            [str(args.llama_server), "-m", str(model), "-t", "2", "-tb", "2", "-c", "2048", "-np", "1",
             "--port", str(theirs), *flash_option],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            ours_url, theirs_url = f"http://127.0.0.1:{ours}", f"http://127.0.0.1:{theirs}"
            wait_up(ours_url)
            wait_up(theirs_url)
            model_id = httpx.get(f"{ours_url}/v1/models").json()["data"][0]["id"]
            figures: dict[str, list[float]] = {}
            for _ in range(args.rounds):
                for stream in (False, True):
                    kind = "streamed" if stream else "whole"
                    figures.setdefault(f"chatapp serve, {kind}", []).append(speed(ours_url, model_id, stream))
                    httpx.post(f"{ours_url}/chatapp/flush", timeout=600)
                    figures.setdefault(f"llama-server, {kind}", []).append(speed(theirs_url, "m", stream))
        finally:
            for process in (chatapp, server):
                process.terminate()
                process.wait(timeout=60)
    for kind in ("whole", "streamed"):
        mine, yours = (statistics.median(figures[f"{who}, {kind}"]) for who in ("chatapp serve", "llama-server"))
        print(f"{kind:9} chatapp serve {mine:6.1f} tok/s  llama-server {yours:6.1f} tok/s  ratio {mine / yours:.3f}")


if __name__ == "__main__":
    main()
