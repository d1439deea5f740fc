"""Warm-ahead on llama-server as the remote engine: the first question on an opened document.

    .venv/bin/python tools/remote_warm_ahead.py

Needs llama-server (tools/build_llama_server.py). One server, three rounds; each round opens
two fresh documents (never cached): one warmed ahead, one asked at once, and asks a question
alone in a new conversation. Prints each first-token time with the prompt tokens the server
computed, and the ratios (the issue's goal: warmed <= 1.2x the question alone).
"""

from __future__ import annotations

import random
import statistics
import tempfile
from pathlib import Path

from chatapp.benchmark.llama_server import LlamaServerPeer, default_llama_server_path
from chatapp.model_files import bundled_model_path
from chatapp.services.chat_service import ChatService
from chatapp.services.library import open_library
from chatapp.services.startup import open_workspace

WORDS = [
    "tide",
    "lamp",
    "fog",
    "keeper",
    "stone",
    "harbour",
    "gull",
    "rope",
    "wave",
    "lens",
    "night",
    "storm",
    "bell",
    "chart",
    "reef",
]
ROUNDS = 3


def document(seed: int) -> str:
    rng = random.Random(seed)
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(14)) + "." for _ in range(110))


def main() -> None:
    binary = default_llama_server_path()
    with LlamaServerPeer(binary, bundled_model_path(), context=4096, threads=2, cache_ram_mib=256) as peer:
        home = Path(tempfile.mkdtemp())
        workspace = open_workspace(
            str(home), {"backend": f"http://127.0.0.1:{peer.port}", "temperature": 0.0, "max_tokens": 4}
        )
        library = open_library(workspace)
        chat = ChatService(workspace, library.conversations, library.personas, library.pins)
        chat.load_model()
        rows: dict[str, list[tuple[float, int]]] = {"warm": [], "cold": [], "alone": []}
        for round_ in range(ROUNDS):
            for number, kind in enumerate(rows):
                chat.current.new_conversation()
                if kind != "alone":
                    path = home / f"{kind}{round_}.txt"
                    path.write_text(document(round_ * 10 + number), encoding="utf-8")
                    chat.attach_document(path)
                    warming = chat.warm_ahead() if kind == "warm" else None
                    if warming is not None:
                        warming.wait()
                result = chat.ask(f"Which word comes most often? ({kind} {round_})").wait()
                rows[kind].append((result.stats.ttft_ms, result.stats.computed_tokens))
        chat.close()
        library.close()
    for kind, values in rows.items():
        shown = ", ".join(f"{ttft:,.0f} ms ({computed:,} computed)" for ttft, computed in values)
        print(f"{kind:>5}: {shown}")
    median = {kind: statistics.median(ttft for ttft, _ in values) for kind, values in rows.items()}
    print(
        f"warm / alone = {median['warm'] / median['alone']:.2f} (goal <= 1.2); cold / alone = "
        f"{median['cold'] / median['alone']:.1f}; cold / warm = {median['cold'] / median['warm']:.1f}"
    )


if __name__ == "__main__":
    main()
