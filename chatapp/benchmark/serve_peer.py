"""`chatapp serve` as a benchmark peer: the same engine and cache as the `chatapp` peer, over HTTP.

The server runs in a process of its own on the peer's folder (its data folder, with a
config.toml holding the run's budgets and sequences), like llama-server. `ask` sends the
prompt as token ids to `/v1/completions`, streamed, greedy, with usage: TTFT runs from
sending the request to the first streamed text, and the computed tokens are the prompt
less `usage.prompt_tokens_details.cached_tokens`. `settle` asks the server to finish the
work after the answer (`POST /chatapp/flush`), as the in-process peer waits for it. A
restart (workload E) stops the server with SIGTERM, which writes the cache, and starts a
new one on the same folder.
"""

from __future__ import annotations

import http.client
import os
import sys
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chatapp.benchmark.peers import PeerAnswer, PeerSettings
from chatapp.benchmark.server_process import ServerPeerError, ServerProcessPeer, free_port

RUN_CLI = "import sys; from chatapp.cli import main; sys.exit(main(sys.argv[1:]))"
MIB = 1 << 20
ENV_API_KEY = "CHATAPP_API_KEY"  # what `chatapp serve` would require of every request


def flush_server(base_url: str, api_key: str | None, timeout_s: float, who: str) -> bool:
    """`POST /chatapp/flush`: wait until the server has stored every answer so far.

    False when the server has no such route (llama-server: it stores nothing after an answer).
    """
    address = urllib.parse.urlsplit(base_url)
    connection_class = http.client.HTTPSConnection if address.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(address.netloc, timeout=timeout_s)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    try:
        connection.request("POST", f"{address.path}/chatapp/flush", body=b"{}", headers=headers)
        response = connection.getresponse()
        detail = response.read().decode("utf-8", "replace").strip()[:200]
    except OSError as error:
        raise ServerPeerError(f"{who}: /chatapp/flush failed ({error})") from None
    finally:
        connection.close()
    if response.status in (404, 405):
        return False
    if response.status != 200:
        raise ServerPeerError(f"{who}: /chatapp/flush answered HTTP {response.status}: {detail}")
    return True


def write_settings(folder: Path, settings: PeerSettings, *, batch_answers: bool = True) -> None:
    """The run's budgets and shape as the server's config.toml (`batch_answers` false: figure N's unbatched side)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        f"sequences = {settings.chatapp_sequences}",
        f"cache_block_size = {settings.block_size}",
        f"cache_ram_mib = {settings.ram_budget_bytes // MIB}",
        f"cache_disk_mib = {settings.disk_budget_bytes // MIB}",
        f"n_gpu_layers = {settings.gpu_layers}",
        f"batch_answers = {'true' if batch_answers else 'false'}",
    ]
    (folder / "config.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")


class ChatappServePeer(ServerProcessPeer):
    """A `chatapp serve` process on the peer's folder."""

    name = "chatapp-serve"

    def __init__(self, settings: PeerSettings, folder: Path, *, batch_answers: bool = True) -> None:
        data = folder / "data"
        write_settings(data, settings, batch_answers=batch_answers)
        port = free_port()
        command = [
            sys.executable,
            "-c",
            RUN_CLI,
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(data),
            "--model",
            str(settings.model_path),
            "--context",
            str(settings.context),
            "--threads",
            str(settings.threads),
        ]
        self.model_id = settings.model_path.stem
        self.serving = f" (model {settings.model_path}, data folder {data})"
        # On loopback the server needs no key: one from $CHATAPP_API_KEY would lock the bench out.
        env = {key: value for key, value in os.environ.items() if key != ENV_API_KEY}
        super().__init__(command, port, env=env)

    def settle(self) -> None:
        flush_server(self.base_url, None, self.request_timeout_s, self.name)

    def ask(self, prompt_tokens: Sequence[int], max_tokens: int) -> PeerAnswer:
        payload = {
            "model": self.model_id,
            "prompt": [int(token) for token in prompt_tokens],
            "max_tokens": int(max_tokens),
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        texts: list[str] = []
        ttft_s: float | None = None
        usage: dict[str, Any] | None = None
        elapsed = 0.0
        for elapsed, chunk in self.stream_events("/v1/completions", payload):
            for choice in chunk.get("choices") or []:
                text = choice.get("text") or ""
                if text and ttft_s is None:
                    ttft_s = elapsed
                texts.append(text)
            if chunk.get("usage"):
                usage = chunk["usage"]
        if usage is None:
            raise ServerPeerError(f"{self.name}: the stream ended without usage: {self.log_tail(5)}")
        self.peak_rss_bytes()
        total_ms = elapsed * 1000
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        return PeerAnswer(
            text="".join(texts),
            token_ids=None,
            ttft_ms=ttft_s * 1000 if ttft_s is not None else total_ms,
            total_ms=total_ms,
            prompt_tokens=int(usage["prompt_tokens"]),
            computed_tokens=int(usage["prompt_tokens"]) - cached,
            answer_tokens=int(usage.get("completion_tokens") or 0),
        )
