"""`chatapp serve` as a user runs it: the URL printed, answers given, a clean stop on Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from chatapp.benchmark.server_process import free_port

pytestmark = pytest.mark.slow
START_TIMEOUT_S = 120.0


@contextmanager
def serve(
    data_dir: Path, model_path: Path, *options: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    chatapp = Path(sys.executable).parent / "chatapp"
    command = [
        str(chatapp),
        "serve",
        "--data-dir",
        str(data_dir),
        "--model",
        str(model_path),
        "--context",
        "1024",
        "--threads",
        "1",
        *options,
    ]
    process = subprocess.Popen(
        command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env={**os.environ, **(env or {})}
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def wait_healthy(url: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        assert process.poll() is None, "the server exited while starting"
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.1)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_serve_answers_and_stops_cleanly(tmp_path: Path, model_path: Path, stop: signal.Signals) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    options = ("--port", str(port), "--model-alias", "gpt-4o", "--max-tokens", "4")
    with serve(tmp_path / "data", model_path, *options, env={"CHATAPP_API_KEY": "k"}) as process:
        wait_healthy(url, process)
        with openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=300) as client:
            model, alias = (listed.id for listed in client.models.list().data)
            completion = client.chat.completions.create(
                model=alias,
                messages=[{"role": "user", "content": "Tell me about lighthouses."}],
                extra_body={"ignore_eos": True},  # four tokens on every CPU
            )
        assert completion.choices[0].message.content
        assert completion.usage is not None
        assert completion.usage.completion_tokens == 4  # --max-tokens: the length of an answer without one
        process.send_signal(stop)
        _, errors = process.communicate(timeout=120)
    assert process.returncode == 0, errors
    assert f"at {url}/v1 (OpenAI)" in errors
    assert f"it answers to {model}, gpt-4o" in errors
    assert "server stopped; the cache is written" in errors
    assert "Traceback" not in errors
    assert "warning" not in errors  # loopback: no warning about a missing key


def test_a_port_in_use_is_a_one_line_error(tmp_path: Path, model_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with serve(tmp_path / "data", model_path, "--port", str(port)) as process:
            _, errors = process.communicate(timeout=120)
    assert process.returncode == 2
    assert errors.strip().splitlines() == [
        f"chatapp: error: cannot listen on 127.0.0.1:{port} (Address already in use); choose another port with --port"
    ]


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (("--max-tokens", "9000"), "--max-tokens 9000 is not an answer length; use 1-8,192"),
        (("--model-alias", " "), "a --model-alias is empty"),
    ],
)
def test_a_wrong_answer_length_or_alias_is_a_one_line_error(
    tmp_path: Path, model_path: Path, option: tuple[str, ...], expected: str
) -> None:
    with serve(tmp_path / "data", model_path, *option) as process:
        _, errors = process.communicate(timeout=120)
    assert process.returncode == 2
    (line,) = errors.strip().splitlines()
    assert line.startswith("chatapp: error: ")
    assert expected in line


def test_an_empty_api_key_is_refused(tmp_path: Path, model_path: Path) -> None:
    with serve(tmp_path / "data", model_path, "--api-key", " ") as process:
        _, errors = process.communicate(timeout=120)
    assert process.returncode == 2
    assert "the API key is empty" in errors


def test_listening_beyond_this_machine_without_a_key_warns(tmp_path: Path, model_path: Path) -> None:
    port = free_port()
    with serve(tmp_path / "data", model_path, "--host", "0.0.0.0", "--port", str(port)) as process:
        wait_healthy(f"http://127.0.0.1:{port}", process)
        process.send_signal(signal.SIGINT)
        _, errors = process.communicate(timeout=120)
    assert process.returncode == 0
    assert "warning: listening on 0.0.0.0 without an API key" in errors
