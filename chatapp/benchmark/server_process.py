"""A benchmark peer that is an HTTP server in a process of its own (llama-server, `chatapp serve`).

Started on 127.0.0.1 with a free port and its output in a temporary log; healthy when
`GET /health` answers 200; its peak RSS read from /proc; stopped with SIGTERM (both
servers shut down cleanly on it), killed if it does not stop. Only the standard library
is used to talk to it, so the client costs the same for every server.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Iterator
from typing import Any, Self

from chatapp.benchmark.anthropic_client import MESSAGES_PATH, read_anthropic_stream
from chatapp.benchmark.memory import proc_status_bytes
from chatapp.benchmark.peers import PeerAnswer
from chatapp.benchmark.workloads import Request
from chatapp.errors import ChatappError

HOST = "127.0.0.1"
STDERR_TAIL_LINES = 15
STOP_TIMEOUT_S = 600.0  # a clean stop writes the cache first: hundreds of MiB on a slow disk


class ServerPeerError(ChatappError):
    """A server peer would not start, or answered with an error."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout_s)


class ServerProcessPeer:
    """Runs `command` (which must listen on `self.port`) until `close()`."""

    name = "server"
    serving = ""  # what it serves, for start-up errors (" (model PATH)")
    serves_together = True  # clients' requests go to the server at once; it schedules them
    error_type: type[ChatappError] = ServerPeerError

    def __init__(
        self,
        command: list[str],
        port: int,
        *,
        start_timeout_s: float = 120.0,
        request_timeout_s: float = 600.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port
        self.command = command
        self.request_timeout_s = request_timeout_s
        self._peak_rss: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        # Lives as long as the server process (closed in close()), so no `with` block.
        self._log = tempfile.TemporaryFile(prefix=f"{self.name}-", suffix=".log")  # noqa: SIM115
        try:
            self._process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env
            )
        except OSError as error:
            self._log.close()
            raise self.error_type(f"cannot start {command[0]}: {error.strerror or error}") from error
        self._finalizer = weakref.finalize(self, stop_process, self._process)
        try:
            self._wait_healthy(start_timeout_s)
        except BaseException:
            self.close()
            raise

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    # -- life cycle -----------------------------------------------------------------------

    def _wait_healthy(self, timeout_s: float) -> None:
        assert self._process is not None
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while True:
            code = self._process.poll()
            if code is not None:
                raise self.error_type(
                    f"{self.name} exited with code {code} while starting{self.serving}: {self.log_tail()}"
                )
            status, body = self._get("/health")
            if status == 200:
                return
            last = f"HTTP {status} {body.strip()[:200]}" if status else body
            if time.monotonic() > deadline:
                raise self.error_type(f"{self.name} not healthy after {timeout_s:.0f} s ({last}): {self.log_tail()}")
            time.sleep(0.1)

    def _get(self, path: str) -> tuple[int, str]:
        return self._request("GET", path, None, timeout=5)

    def _request(self, method: str, path: str, body: bytes | None, timeout: float) -> tuple[int, str]:
        connection = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            connection.request(method, path, body=body, headers=headers)
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
            stop_process(self._process)
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
        """Nothing to wait for, unless the server says otherwise."""

    def ask_messages(self, body: dict[str, Any]) -> PeerAnswer:
        """A request in Anthropic's Messages API (K), streamed: chatapp serve and llama-server both serve it."""
        body = {**body, "model": getattr(self, "model_id", body["model"])}  # the name it serves under, if any
        answer = read_anthropic_stream(self.stream_events(MESSAGES_PATH, body))
        self.peak_rss_bytes()
        return answer

    def stream_events(self, path: str, payload: dict[str, Any]) -> Iterator[tuple[float, dict[str, Any]]]:
        """POST `payload` and yield (seconds since sending, event) for each server-sent `data:` event."""
        if self._process is None:
            raise self.error_type(f"{self.name} is closed")
        connection = http.client.HTTPConnection(HOST, self.port, timeout=self.request_timeout_s)
        try:
            started = time.perf_counter()
            connection.request(
                "POST", path, body=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
            )
            response = connection.getresponse()
            if response.status != 200:
                detail = response.read().decode("utf-8", "replace").strip()[:300]
                raise self.error_type(f"{self.name}: {path} answered HTTP {response.status}: {detail}")
            while True:
                raw = response.readline()
                if not raw:
                    return
                line = raw.decode("utf-8", "replace").strip()
                if line.startswith("error:"):
                    raise self.error_type(f"{self.name}: {line[6:].strip()[:300]}")
                if not line.startswith("data:"):
                    continue  # blank separators and ": ping" comments
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if "error" in event and "content" not in event and "choices" not in event:
                    raise self.error_type(f"{self.name}: {json.dumps(event['error'])[:300]}")
                yield time.perf_counter() - started, event
        except OSError as error:
            raise self.error_type(f"{self.name}: request failed ({error}): {self.log_tail(5)}") from error
        finally:
            connection.close()
