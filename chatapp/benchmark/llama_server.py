"""llama.cpp's own server (`llama-server`) as a benchmark peer.

The binary is built from the llama.cpp that chatapp links (the sources vendored in the
installed llama-cpp-python's sdist) by `tools/build_llama_server.py`; it lands where
`default_llama_server_path()` looks. `LlamaServerPeer` starts it on 127.0.0.1 with a free
port, with the same model, per-conversation context, threads and batch as the other
peers, flash attention off (as chatapp runs it), one KV stream per slot (`-np N` with an
explicit N keeps `--kv-unified` off, like chatapp's `kv_unified = false`) and a host-RAM
prompt cache of `cache_ram_mib` (`--cache-ram`; 0 disables it).

`ask` sends the prompt as token ids to `/completion`, streamed, greedy, with
`cache_prompt` so the server reuses its slot's KV and its RAM prompt cache. TTFT runs from
sending the request to the first streamed chunk that carries a token; `computed_tokens`
is the server's own `timings.prompt_n` (prompt tokens evaluated; `timings.cache_n` were
reused). The server always evaluates at least the last prompt token, to get its logits.

Only the standard library is used to talk to the server.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NotRequired, TypedDict, Unpack

import platformdirs

from chatapp.benchmark.peers import PeerAnswer, PeerSettings
from chatapp.benchmark.server_process import HOST, ServerPeerError, ServerProcessPeer, free_port

ENV_BINARY = "CHATAPP_LLAMA_SERVER"
BUILD_HINT = "build it with `.venv/bin/python tools/build_llama_server.py` or set $CHATAPP_LLAMA_SERVER"
SERVER_BINARY_NAME = "llama-server.exe" if sys.platform == "win32" else "llama-server"


class LlamaServerError(ServerPeerError):
    """llama-server is missing, would not start, or answered with an error."""


def llama_cpp_version() -> str:
    return importlib.metadata.version("llama-cpp-python")


def default_build_dir(version: str | None = None) -> Path:
    """Where tools/build_llama_server.py puts the binary for a llama-cpp-python version."""
    cache = Path(platformdirs.user_cache_dir("chatapp", appauthor=False))
    return cache / "llama-server" / (version or llama_cpp_version())


def default_llama_server_path() -> Path:
    """$CHATAPP_LLAMA_SERVER, else the binary tools/build_llama_server.py builds (it may not exist)."""
    env_value = os.environ.get(ENV_BINARY)
    if env_value:
        return Path(env_value).expanduser()
    return default_build_dir() / SERVER_BINARY_NAME


class ServerOptions(TypedDict):
    """How the server runs: `context` is per slot (per conversation)."""

    context: int
    threads: int
    cache_ram_mib: int
    slots: NotRequired[int]
    batch: NotRequired[int | None]
    flash_attention: NotRequired[bool]
    gpu_layers: NotRequired[int]  # -ngl: 0 (the default) runs as the chatapp peers do, on the CPU
    chat_template_file: NotRequired[Path | None]  # instead of the model's own (K: tool_template.py)


def server_command(binary: Path, model: Path, *, port: int, **options: Unpack[ServerOptions]) -> list[str]:
    """The command line that starts the server."""
    context, threads, slots = options["context"], options["threads"], options.get("slots", 1)
    batch, flash_attention = options.get("batch"), options.get("flash_attention", False)
    command = [
        str(binary),
        "--host",
        HOST,
        "--port",
        str(port),
        "-m",
        str(model),
        "-c",
        str(context * slots),
        "-np",
        str(slots),
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "--cache-ram",
        str(options["cache_ram_mib"]),
        "-fa",
        "on" if flash_attention else "off",
        "-ngl",
        str(options.get("gpu_layers", 0)),
        "--no-webui",
    ]
    if batch is not None:
        command += ["-b", str(batch), "-ub", str(batch)]
    if options.get("chat_template_file") is not None:
        command += ["--chat-template-file", str(options["chat_template_file"])]
    return command


class LlamaServerPeer(ServerProcessPeer):
    """A llama-server process serving one model; `ask` is one greedy streamed completion."""

    error_type = LlamaServerError

    def __init__(
        self,
        binary: Path,
        model: Path,
        *,
        name: str = "llama-server",
        start_timeout_s: float = 120.0,
        request_timeout_s: float = 600.0,
        **options: Unpack[ServerOptions],
    ) -> None:
        self.name = name
        self.binary = Path(binary)
        self.model = Path(model)
        self.serving = f" (model {self.model})"
        if not self.binary.is_file():
            raise LlamaServerError(f"llama-server binary not found: {self.binary}; {BUILD_HINT}")
        if not os.access(self.binary, os.X_OK):
            raise LlamaServerError(f"llama-server binary is not executable: {self.binary}")
        if not self.model.is_file():
            raise LlamaServerError(f"model file not found: {self.model}")
        port = free_port()
        command = server_command(self.binary, self.model, port=port, **options)
        # LLAMA_ARG_* variables would silently change the server's settings.
        env = {key: value for key, value in os.environ.items() if not key.startswith("LLAMA_ARG_")}
        super().__init__(command, port, start_timeout_s=start_timeout_s, request_timeout_s=request_timeout_s, env=env)

    def settle(self) -> None:
        """Nothing to wait for: a slot's prompt goes to the RAM cache when a later request takes the slot."""

    def ask(self, prompt_tokens: Sequence[int], max_tokens: int) -> PeerAnswer:
        payload = {
            "prompt": [int(token) for token in prompt_tokens],
            "n_predict": int(max_tokens),
            "temperature": 0,
            "top_k": 1,
            "stream": True,
            "cache_prompt": True,
            "return_tokens": True,
        }
        texts: list[str] = []
        tokens: list[int] = []
        saw_tokens = False
        ttft_s: float | None = None
        final: dict[str, Any] | None = None
        elapsed = 0.0
        for elapsed, chunk in self.stream_events("/completion", payload):
            content = chunk.get("content") or ""
            chunk_tokens = chunk.get("tokens")
            if isinstance(chunk_tokens, list):
                saw_tokens = True
                tokens.extend(int(token) for token in chunk_tokens)
            if ttft_s is None and (content or chunk_tokens):
                ttft_s = elapsed
            texts.append(content)
            if chunk.get("stop"):
                final = chunk
                break
        if final is None:
            raise LlamaServerError(f"{self.name}: the stream ended without a final chunk: {self.log_tail(5)}")
        self.peak_rss_bytes()
        timings = final.get("timings") or {}
        computed = timings.get("prompt_n")
        if computed is None:
            computed = len(prompt_tokens) - int(timings.get("cache_n", 0))
        total_ms = elapsed * 1000
        return PeerAnswer(
            text="".join(texts),
            token_ids=tuple(tokens) if saw_tokens else None,
            ttft_ms=ttft_s * 1000 if ttft_s is not None else total_ms,
            total_ms=total_ms,
            prompt_tokens=len(prompt_tokens),
            computed_tokens=int(computed),
            answer_tokens=int(timings.get("predicted_n", len(tokens))),
        )


def uncached_server(
    settings: PeerSettings, binary: Path, *, slots: int = 1, flash_attention: bool = False
) -> LlamaServerPeer:
    """llama-server with nothing cached between requests, shaped as chatapp's engine is (figures P and N)."""
    return LlamaServerPeer(
        binary,
        settings.model_path,
        context=settings.context,
        threads=settings.threads,
        cache_ram_mib=0,
        slots=slots,
        batch=settings.n_batch,
        flash_attention=flash_attention,
        gpu_layers=settings.gpu_layers,
    )
