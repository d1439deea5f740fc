"""`chatapp ask --backend URL`: a real `chatapp serve` on loopback answers, and says what it reused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chatapp.benchmark.server_process import free_port
from chatapp.cli import main
from chatapp.engine.remote import served_model_fingerprint
from chatapp.engine.remote_chat import RemoteChatEngine
from chatapp.engine.remote_http import RemoteClient
from chatapp.services import startup
from tests.server_support import SYSTEM_PROMPT, Backend, dying_mid_answer

pytestmark = pytest.mark.slow
QUICK = ["--max-tokens", "8", "--temperature", "0"]


def ask(capsys: pytest.CaptureFixture[str], backend: Backend, *args: str) -> tuple[dict[str, Any], str]:
    assert main(["ask", *args, *QUICK, "--json", "--backend", backend.url, "--backend-key", backend.key]) == 0
    lines = capsys.readouterr().out.splitlines()
    return json.loads(lines[-1]), "\n".join(lines[:-1])


def test_ask_streams_from_the_backend_and_the_next_question_reuses_its_cache(
    data_dir: Path, capsys: pytest.CaptureFixture[str], backend: Backend
) -> None:
    first, streamed = ask(capsys, backend, "Name a famous lighthouse.", "--system", SYSTEM_PROMPT)
    assert streamed == first["answer"] != ""
    assert first["model"] == backend.url
    served = served_model_fingerprint(backend.server.serving.props())
    assert first["model_fingerprint"] == f"remote:{backend.url}#{served}"
    assert first["reused_tokens"] + first["computed_tokens"] == first["prompt_tokens"]
    second, _ = ask(capsys, backend, "Name a lighthouse in Wales.", "--system", SYSTEM_PROMPT)
    assert second["reuse_tier"] == "server"
    persona_tokens = len(backend.server.engine.tokenize(SYSTEM_PROMPT))
    assert second["reused_tokens"] >= persona_tokens


def test_a_wrong_backend_key_is_one_line_and_exit_2(
    data_dir: Path, capsys: pytest.CaptureFixture[str], backend: Backend
) -> None:
    assert main(["ask", "Hello?", "--backend", backend.url, "--backend-key", "wrong"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "refused the API key (HTTP 401); set --backend-key" in error


def test_an_unreachable_backend_is_one_line_and_exit_2(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["ask", "Hello?", "--backend", url]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"chatapp: error: cannot reach the engine at {url} (")
    assert error.endswith("; start the server or fix --backend\n")
    assert error.count("\n") == 1


def test_a_backend_that_is_not_an_address_is_refused(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ask", "Hello?", "--backend", "gpu-box:8080"]) == 2
    assert "not an http:// or https:// address" in capsys.readouterr().err


def test_ask_on_a_server_that_builds_its_own_prompts_says_so(
    data_dir: Path, capsys: pytest.CaptureFixture[str], backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As in front of vLLM or Ollama: chat messages go, the server's reuse comes back, a note says which mode."""
    monkeypatch.setattr(startup, "connect_remote_engine", lambda config: RemoteChatEngine(RemoteClient(config)))
    args = ["ask", "Name a lighthouse in Ireland.", *QUICK, "--json", "--backend", backend.url]
    assert main([*args, "--backend-key", backend.key, "--system", SYSTEM_PROMPT]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out.splitlines()[-1])
    assert record["answer"]
    assert record["reused_tokens"] + record["computed_tokens"] == record["prompt_tokens"] > 0
    assert f"chatapp: warning: the engine at {backend.url} builds its own prompts" in captured.err
    assert captured.err.count("\n") == 1


def test_a_backend_dying_mid_answer_keeps_what_was_printed_and_is_one_line(
    data_dir: Path, capsys: pytest.CaptureFixture[str], backend: Backend
) -> None:
    args = ["ask", "Tell me a long story about a lighthouse keeper.", "--max-tokens", "40"]
    with dying_mid_answer(backend):
        code = main([*args, "--backend", backend.url, "--backend-key", backend.key])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out.strip(), "the answer's beginning was printed before the server died"
    assert captured.err.count("\n") == 1
    assert captured.err.startswith(f"chatapp: error: the connection to the engine at {backend.url} broke")
