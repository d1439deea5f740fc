"""The llama-server peer: its command line, its start-up errors and, when a binary is
built (tools/build_llama_server.py, or $CHATAPP_LLAMA_SERVER), a real server's answers."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from chatapp.benchmark.llama_server import (
    LlamaServerError,
    LlamaServerPeer,
    default_llama_server_path,
    server_command,
)

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="fake servers are shell scripts")


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _model(tmp_path: Path) -> Path:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    return model


def test_command_line() -> None:
    command = server_command(
        Path("/bin/llama-server"),
        Path("/m.gguf"),
        port=8123,
        context=1024,
        threads=2,
        cache_ram_mib=256,
        slots=2,
    )
    assert command[0] == "/bin/llama-server"
    joined = " ".join(command)
    assert "--host 127.0.0.1 --port 8123" in joined
    assert "-m /m.gguf" in joined
    assert "-c 2048 -np 2" in joined  # context is per slot
    assert "-t 2 -tb 2" in joined
    assert "--cache-ram 256" in joined
    assert "-fa off" in joined
    assert "--no-webui" in joined
    assert "-ngl 0" in joined, "on the CPU unless the bench is asked to offload"
    assert "-b" not in command
    offloaded = server_command(Path("s"), Path("m"), port=1, context=8, threads=1, cache_ram_mib=0, gpu_layers=-1)
    assert "-ngl -1" in " ".join(offloaded)
    batched = server_command(Path("s"), Path("m"), port=1, context=8, threads=1, cache_ram_mib=0, batch=512)
    assert batched[-4:] == ["-b", "512", "-ub", "512"]
    templated = server_command(
        Path("s"), Path("m"), port=1, context=8, threads=1, cache_ram_mib=0, chat_template_file=Path("/t.jinja")
    )
    assert templated[-2:] == ["--chat-template-file", "/t.jinja"]


def test_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CHATAPP_LLAMA_SERVER", str(tmp_path / "custom"))
    assert default_llama_server_path() == tmp_path / "custom"
    monkeypatch.delenv("CHATAPP_LLAMA_SERVER")
    assert default_llama_server_path().name.startswith("llama-server")


def test_missing_binary(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-llama-server"
    with pytest.raises(LlamaServerError, match="binary not found") as caught:
        LlamaServerPeer(missing, _model(tmp_path), context=256, threads=1, cache_ram_mib=0)
    assert str(missing) in str(caught.value)
    assert "build_llama_server.py" in str(caught.value)


@posix_only
def test_missing_model(tmp_path: Path) -> None:
    binary = _script(tmp_path / "server", "exit 0")
    missing = tmp_path / "missing.gguf"
    with pytest.raises(LlamaServerError, match="model file not found") as caught:
        LlamaServerPeer(binary, missing, context=256, threads=1, cache_ram_mib=0)
    assert str(missing) in str(caught.value)


@posix_only
def test_server_that_exits_reports_its_output(tmp_path: Path) -> None:
    binary = _script(tmp_path / "server", 'echo "error: failed to load model" >&2; exit 3')
    # A start timeout far beyond the test's own: only noticing the exit can end this call.
    with pytest.raises(LlamaServerError, match="exited with code 3") as caught:
        LlamaServerPeer(binary, _model(tmp_path), context=256, threads=1, cache_ram_mib=0, start_timeout_s=100_000)
    assert "failed to load model" in str(caught.value)
    assert "model.gguf" in str(caught.value)


@posix_only
@pytest.mark.slow
def test_server_never_healthy_times_out_and_is_stopped(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    binary = _script(tmp_path / "server", f'echo $$ > "{pid_file}"; echo "loading forever"; exec sleep 60')
    with pytest.raises(LlamaServerError, match="not healthy after 1 s") as caught:
        LlamaServerPeer(binary, _model(tmp_path), context=256, threads=1, cache_ram_mib=0, start_timeout_s=1)
    assert "loading forever" in str(caught.value)
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


# -- a real server ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server_binary() -> Path:
    binary = default_llama_server_path()
    if not binary.is_file():
        pytest.skip("llama-server not built: run tools/build_llama_server.py")
    return binary


@pytest.mark.slow
def test_real_server_rejects_a_bad_model_quickly(server_binary: Path, tmp_path: Path) -> None:
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"this is not a gguf file" * 10)
    with pytest.raises(LlamaServerError, match="exited with code") as caught:
        LlamaServerPeer(server_binary, bad, context=256, threads=1, cache_ram_mib=0, start_timeout_s=100_000)
    assert "not-a-model.gguf" in str(caught.value)


@pytest.mark.slow
def test_real_server_answers_and_reuses_its_cache(server_binary: Path, model_path: Path, vocab) -> None:
    prompt = vocab.tokenize(
        "<|im_start|>user\nName three colours of the rainbow.<|im_end|>\n<|im_start|>assistant\n",
        add_special=True,
        parse_special=True,
    )
    with LlamaServerPeer(server_binary, model_path, context=1024, threads=2, cache_ram_mib=64) as peer:
        cold = peer.ask(prompt, 8)
        warm = peer.ask(prompt, 8)
        again = peer.ask(prompt, 8)
        rss = peer.peak_rss_bytes()
    assert cold.text
    assert warm.text
    assert cold.token_ids
    assert vocab.detokenize(list(cold.token_ids)) == cold.text
    # The same prompt from the server's cache gives the same answer every time. (It need not
    # equal the cold answer: the server recomputes the last prompt token alone, and a batch of
    # one rounds differently from the cold batch of 16; llama-cpp-python's `Llama.generate`
    # does the same, and on this prompt both turn "1. Red: ..." into "The rainbow ...".)
    assert warm.text == again.text
    assert warm.token_ids == again.token_ids
    assert cold.prompt_tokens == warm.prompt_tokens == len(prompt)
    assert cold.computed_tokens == len(prompt)
    assert warm.computed_tokens < cold.computed_tokens
    assert again.computed_tokens == warm.computed_tokens
    for answer in (cold, warm, again):
        assert 0 < answer.ttft_ms <= answer.total_ms
    if sys.platform.startswith("linux"):
        assert rss is not None
        assert rss > 50 * 1024 * 1024
    with pytest.raises(LlamaServerError, match="closed"):
        peer.ask(prompt, 4)
