"""Sizing advice against a real server: `chatapp serve` under a client workload, then `chatapp cache advise`.

Runs a server on a fresh data folder with small budgets, sends chat requests from a few personas
(Zipf-popular; some go on with an earlier conversation of theirs), optionally restarts the server
part-way, and prints what the log measured and what the advice predicts at the budgets in force,
and, with --then-disk-mib, at a larger disk budget which a second, fresh server then measures on
the same requests.

    .venv/bin/python tools/advice_check.py                      # 32 MiB disk, 8 MiB RAM, value policy
    .venv/bin/python tools/advice_check.py --restart-at 45      # the server restarted after 45 requests
    .venv/bin/python tools/advice_check.py --then-disk-mib 256  # and checked at 256 MiB
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

WORDS = [
    "cache",
    "prefix",
    "model",
    "token",
    "state",
    "block",
    "disk",
    "memory",
    "answer",
    "question",
    "persona",
    "document",
    "branch",
    "restore",
    "hash",
    "budget",
    "policy",
    "thread",
    "engine",
    "request",
    "client",
    "server",
    "window",
    "layer",
    "batch",
    "stream",
    "prompt",
    "reply",
]


@dataclass(frozen=True)
class Step:
    persona: int
    question: str
    goes_on: bool  # with the persona's last conversation, else a new one


def persona_prompt(rng: random.Random, number: int) -> str:
    words = rng.randint(220, 450)  # about 300-600 tokens
    return f"You are assistant number {number}. " + " ".join(rng.choice(WORDS) for _ in range(words))


def workload(requests: int, personas: int, seed: int) -> tuple[list[str], list[Step]]:
    """The personas' system prompts and the requests, Zipf-popular personas."""
    rng = random.Random(seed)
    prompts = [persona_prompt(rng, number) for number in range(personas)]
    weights = [1 / (rank + 1) for rank in range(personas)]
    steps = [
        Step(
            rng.choices(range(personas), weights)[0],
            "Question: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))),
            rng.random() < 0.4,
        )
        for _ in range(requests)
    ]
    return prompts, steps


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    def __init__(self, data: Path) -> None:
        self.data, self.port = data, free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "chatapp", "serve", "--data-dir", str(data), "--port", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                models = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=2).read())
                self.model = models["data"][0]["id"]
                return
            except OSError:
                time.sleep(0.5)
        raise SystemExit("the server did not start")

    def chat(self, messages: list[dict[str, str]]) -> tuple[str, int, int]:
        body = json.dumps({"model": self.model, "messages": messages, "max_tokens": 12, "temperature": 0}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/chat/completions", body, {"Content-Type": "application/json"}
        )
        answer = json.loads(urllib.request.urlopen(request, timeout=600).read())
        usage = answer["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return answer["choices"][0]["message"]["content"], usage["prompt_tokens"], cached

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=120)


def run(data: Path, prompts: list[str], steps: list[Step], restart_at: int | None) -> list[tuple[int, int]]:
    """Send the requests; (prompt tokens, cached tokens) per request."""
    server = Server(data)
    last: dict[int, list[dict[str, str]]] = {}
    figures: list[tuple[int, int]] = []
    try:
        for number, step in enumerate(steps):
            if restart_at is not None and number == restart_at:
                server.stop()
                server = Server(data)
            earlier = last.get(step.persona) if step.goes_on else None
            start = earlier or [{"role": "system", "content": prompts[step.persona]}]
            messages = [*start, {"role": "user", "content": step.question}]
            content, prompt, cached = server.chat(messages)
            last[step.persona] = [*messages, {"role": "assistant", "content": content}]
            figures.append((prompt, cached))
    finally:
        server.stop()
    return figures


def advise(data: Path) -> dict[str, object]:
    output = subprocess.run(
        [sys.executable, "-m", "chatapp", "cache", "advise", "--json", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    advice: dict[str, object] = json.loads(output)
    return advice


def share(figures: list[tuple[int, int]]) -> float:
    return sum(cached for _, cached in figures) / max(1, sum(prompt for prompt, _ in figures))


def enough_mib(rows: list[dict[str, object]]) -> int:
    """The advice's rule where the log is too short for it to suggest: the smallest disk budget within half a
    point of an unlimited one."""
    best = float(str(rows[-1]["reused_share"]))
    enough = next(row for row in rows if float(str(row["reused_share"])) >= best - 0.005)
    budget = enough["budget_bytes"]
    if not isinstance(budget, int):
        raise SystemExit("only an unlimited disk keeps what these requests reuse")
    return budget >> 20


def configure(data: Path, disk_mib: int, ram_mib: int, eviction: str) -> None:
    data.mkdir(parents=True, exist_ok=True)
    (data / "config.toml").write_text(
        f'cache_disk_mib = {disk_mib}\ncache_ram_mib = {ram_mib}\ncache_eviction = "{eviction}"\n'
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=90)
    parser.add_argument("--personas", type=int, default=8)
    parser.add_argument("--disk-mib", type=int, default=32)
    parser.add_argument("--ram-mib", type=int, default=8)
    parser.add_argument("--eviction", default="value", choices=["value", "lru", "lfu"])
    parser.add_argument("--restart-at", type=int, help="restart the server before this request")
    parser.add_argument(
        "--then-disk-mib", type=int, help="predict this disk budget (0: the one the advice suggests), then measure it"
    )
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--keep", type=Path, metavar="DIR", help="keep the data folders here (for a look at the log)")
    arguments = parser.parse_args()
    prompts, steps = workload(arguments.requests, arguments.personas, arguments.seed)
    with tempfile.TemporaryDirectory(prefix="advice-check-") as temporary:
        folder = arguments.keep or temporary
        data = Path(folder) / "first"
        configure(data, arguments.disk_mib, arguments.ram_mib, arguments.eviction)
        figures = run(data, prompts, steps, arguments.restart_at)
        advice = advise(data)
        print(
            f"{arguments.disk_mib} MiB disk, {arguments.ram_mib} MiB RAM ({arguments.eviction}): "
            f"measured {advice['measured_share']:.1%} (usage: {share(figures):.1%}), "
            f"predicted {advice['predicted_share']:.1%}"
        )
        if arguments.restart_at is not None:
            after = figures[arguments.restart_at :]
            print(f"after the restart: {share(after):.1%} of {len(after)} requests' prompt tokens reused")
        print(f"suggestion: {advice['suggestion']}")
        if arguments.then_disk_mib is not None:
            rows = advice["disk"]
            assert isinstance(rows, list)
            suggested = advice["suggested_disk_mib"]
            then_mib = arguments.then_disk_mib or (suggested if isinstance(suggested, int) else enough_mib(rows))
            budget = then_mib << 20
            predicted = next((row["reused_share"] for row in rows if row["budget_bytes"] == budget), None)
            second = Path(folder) / "second"
            configure(second, then_mib, arguments.ram_mib, arguments.eviction)
            measured = share(run(second, prompts, steps, arguments.restart_at))
            print(f"{then_mib} MiB disk: predicted {predicted:.1%}, measured {measured:.1%}")


if __name__ == "__main__":
    main()
