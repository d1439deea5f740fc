"""llama.cpp's own server (`llama-server`) as a benchmark peer.

The binary is built from the llama.cpp that chatapp links (the sources vendored in the
installed llama-cpp-python's sdist) by `scripts/build_llama_server.py`; it lands where
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

import http.client
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import platformdirs

from chatapp.benchmark.memory import proc_status_bytes
from chatapp.benchmark.peers import PeerAnswer
from chatapp.benchmark.workloads import Request
from chatapp.errors import ChatappError

ENV_BINARY = "CHATAPP_LLAMA_SERVER"
HOST = "127.0.0.1"
BUILD_HINT = "build it with `.venv/bin/python scripts/build_llama_server.py` or set $CHATAPP_LLAMA_SERVER"
STDERR_TAIL_LINES = 15
SERVER_BINARY_NAME = "llama-server.exe" if sys.platform == "win32" else "llama-server"


class LlamaServerError(ChatappError):
    """llama-server is missing, would not start, or answered with an error."""


def llama_cpp_version() -> str:
    return importlib.metadata.version("llama-cpp-python")


def default_build_dir(version: str | None = None) -> Path:
    """Where scripts/build_llama_server.py puts the binary for a llama-cpp-python version."""
    cache = Path(platformdirs.user_cache_dir("chatapp", appauthor=False))
    return cache / "llama-server" / (version or llama_cpp_version())


def default_llama_server_path() -> Path:
    """$CHATAPP_LLAMA_SERVER, else the binary scripts/build_llama_server.py builds (it may not exist)."""
    env_value = os.environ.get(ENV_BINARY)
    if env_value:
        return Path(env_value).expanduser()
    return default_build_dir() / SERVER_BINARY_NAME


def server_command(
    binary: Path,
    model: Path,
    *,
    port: int,
    context: int,
    threads: int,
    cache_ram_mib: int,
    slots: int = 1,
    batch: int | None = None,
) -> list[str]:
    """The command line that starts the server; `context` is per slot (per conversation)."""
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
        str(cache_ram_mib),
        "-fa",
        "off",
        "--no-webui",
    ]
    if batch is not None:
        command += ["-b", str(batch), "-ub", str(batch)]
    return command


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _stop_process(process: subprocess.Popen[bytes], timeout_s: float = 5.0) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout_s)


class LlamaServerPeer:
    """A llama-server process serving one model; `ask` is one greedy streamed completion."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        *,
        context: int,
        threads: int,
        cache_ram_mib: int,
        slots: int = 1,
        batch: int | None = None,
        name: str = "llama-server",
        start_timeout_s: float = 120.0,
        request_timeout_s: float = 600.0,
    ) -> None:
        self.name = name
        self.binary = Path(binary)
        self.model = Path(model)
        self.request_timeout_s = request_timeout_s
        self._peak_rss: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        if not self.binary.is_file():
            raise LlamaServerError(f"llama-server binary not found: {self.binary}; {BUILD_HINT}")
        if not os.access(self.binary, os.X_OK):
            raise LlamaServerError(f"llama-server binary is not executable: {self.binary}")
        if not self.model.is_file():
            raise LlamaServerError(f"model file not found: {self.model}")
        # Lives as long as the server process (closed in close()), so no `with` block.
        self._log = tempfile.TemporaryFile(prefix="llama-server-", suffix=".log")  # noqa: SIM115
        self.port = free_port()
        self.command = server_command(
            self.binary,
            self.model,
            port=self.port,
            context=context,
            threads=threads,
            cache_ram_mib=cache_ram_mib,
            slots=slots,
            batch=batch,
        )
        # LLAMA_ARG_* variables would silently change the server's settings.
        env = {key: value for key, value in os.environ.items() if not key.startswith("LLAMA_ARG_")}
        try:
            self._process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        except OSError as error:
            self._log.close()
            raise LlamaServerError(f"cannot start {self.binary}: {error.strerror or error}") from error
        self._finalizer = weakref.finalize(self, _stop_process, self._process)
        try:
            self._wait_healthy(start_timeout_s)
        except BaseException:
            self.close()
            raise

    # -- life cycle -----------------------------------------------------------------------

    def _wait_healthy(self, timeout_s: float) -> None:
        assert self._process is not None
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while True:
            code = self._process.poll()
            if code is not None:
                raise LlamaServerError(
                    f"llama-server exited with code {code} while starting (model {self.model}): {self.log_tail()}"
                )
            status, body = self._get("/health")
            if status == 200:
                return
            last = f"HTTP {status} {body.strip()[:200]}" if status else body
            if time.monotonic() > deadline:
                raise LlamaServerError(f"llama-server not healthy after {timeout_s:.0f} s ({last}): {self.log_tail()}")
            time.sleep(0.1)

    def _get(self, path: str) -> tuple[int, str]:
        connection = http.client.HTTPConnection(HOST, self.port, timeout=5)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read().decode("utf-8", "replace")
        except OSError as error:
            return 0, str(error)
        finally:
            connection.close()

    def log_tail(self, lines: int = STDERR_TAIL_LINES) -> str:
        """The last lines the server wrote (stdout and stderr), joined with ' ;; '."""
        if self._log.closed:
            return ""
        self._log.flush()
        self._log.seek(0, os.SEEK_END)
        size = self._log.tell()
        self._log.seek(max(0, size - 16384))
        text = self._log.read().decode("utf-8", "replace")
        tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
        return " ;; ".join(tail) or "(no output)"

    def peak_rss_bytes(self) -> int | None:
        """The server's peak resident memory so far (Linux VmHWM); None where unknown."""
        if self._process is not None and self._process.poll() is None:
            current = proc_status_bytes("VmHWM", self._process.pid)
            if current is not None:
                self._peak_rss = max(self._peak_rss or 0, current)
        return self._peak_rss

    def close(self) -> None:
        if self._process is not None:
            self.peak_rss_bytes()
            self._finalizer.detach()
            _stop_process(self._process)
            self._process = None
        if not self._log.closed:
            self._log.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- requests -------------------------------------------------------------------------

    def prepare(self, request: Request) -> dict[str, float] | None:
        return None

    def settle(self) -> None:
        """Nothing to wait for: the server copies a slot's prompt "
        "to its RAM cache when a later request takes the slot."""

    def ask(self, prompt_tokens: Sequence[int], max_tokens: int) -> PeerAnswer:
        if self._process is None:
            raise LlamaServerError(f"{self.name} is closed")
        body = json.dumps(
            {
                "prompt": [int(token) for token in prompt_tokens],
                "n_predict": int(max_tokens),
                "temperature": 0,
                "top_k": 1,
                "stream": True,
                "cache_prompt": True,
                "return_tokens": True,
            }
        ).encode()
        connection = http.client.HTTPConnection(HOST, self.port, timeout=self.request_timeout_s)
        texts: list[str] = []
        tokens: list[int] = []
        saw_tokens = False
        ttft_ms: float | None = None
        final: dict[str, Any] | None = None
        try:
            started = time.perf_counter()
            connection.request("POST", "/completion", body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            if response.status != 200:
                detail = response.read().decode("utf-8", "replace").strip()[:300]
                raise LlamaServerError(f"{self.name}: /completion answered HTTP {response.status}: {detail}")
            while True:
                raw = response.readline()
                if not raw:
                    break
                line = raw.decode("utf-8", "replace").strip()
                if line.startswith("error:"):
                    raise LlamaServerError(f"{self.name}: {line[6:].strip()[:300]}")
                if not line.startswith("data:"):
                    continue  # blank separators and ": ping" comments
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk and "content" not in chunk:
                    raise LlamaServerError(f"{self.name}: {json.dumps(chunk['error'])[:300]}")
                content = chunk.get("content") or ""
                chunk_tokens = chunk.get("tokens")
                if isinstance(chunk_tokens, list):
                    saw_tokens = True
                    tokens.extend(int(token) for token in chunk_tokens)
                if ttft_ms is None and (content or chunk_tokens):
                    ttft_ms = (time.perf_counter() - started) * 1000
                texts.append(content)
                if chunk.get("stop"):
                    final = chunk
                    break
            total_ms = (time.perf_counter() - started) * 1000
        except OSError as error:
            raise LlamaServerError(f"{self.name}: request failed ({error}): {self.log_tail(5)}") from error
        finally:
            connection.close()
        if final is None:
            raise LlamaServerError(f"{self.name}: the stream ended without a final chunk: {self.log_tail(5)}")
        self.peak_rss_bytes()
        timings = final.get("timings") or {}
        computed = timings.get("prompt_n")
        if computed is None:
            computed = len(prompt_tokens) - int(timings.get("cache_n", 0))
        return PeerAnswer(
            text="".join(texts),
            token_ids=tuple(tokens) if saw_tokens else None,
            ttft_ms=ttft_ms if ttft_ms is not None else total_ms,
            total_ms=total_ms,
            prompt_tokens=len(prompt_tokens),
            computed_tokens=int(computed),
        )
