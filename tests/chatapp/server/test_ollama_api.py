"""The Ollama API driven by the official `ollama` client against a real server on the bundled model."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import gguf
import httpx
import ollama
import pytest

from chatapp.server import ollama_models
from tests.server_support import SYSTEM_PROMPT, RunningServer

OPTIONS = {"temperature": 0, "num_predict": 10}
# Ollama has no ignore_eos: an answer held to a JSON list of 11 numbers, more than 10 tokens can hold (no token
# of this vocabulary holds two digits), runs to num_predict on every CPU, wherever a free answer would end.
LONGER_THAN_THE_ANSWER = {"type": "array", "items": {"type": "integer"}, "minItems": 11}


@pytest.fixture
def local(server: RunningServer) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=300)


def gguf_says(path: Path) -> dict[str, object]:
    """What the model file's metadata says, read by the `gguf` package (not the server's reader)."""
    reader = gguf.GGUFReader(path)
    fields = {name: reader.get_field(name) for name in ("general.architecture", "general.size_label")}
    file_type = reader.get_field("general.file_type")
    assert file_type is not None
    return {
        **{name: field.contents() if field is not None else "" for name, field in fields.items()},
        "quantization": gguf.LlamaFileType(file_type.contents()).name.removeprefix("MOSTLY_"),
    }


def test_the_served_model_is_listed_with_its_details_and_a_version(
    local: ollama.Client, server: RunningServer, model_path: Path
) -> None:
    said = gguf_says(model_path)
    listed = local.list().models
    assert [model.model for model in listed] == [f"{server.model_id}:latest"]
    assert httpx.get(f"{server.url}/api/version").json()["version"]
    shown = local.show(f"{server.model_id}:latest")
    for details in (listed[0].details, shown.details):
        assert details is not None
        assert details.family == said["general.architecture"]
        assert details.parameter_size == said["general.size_label"]
        assert details.quantization_level == said["quantization"]
    assert listed[0].size == model_path.stat().st_size
    assert shown.capabilities == ["completion", "tools"]
    assert shown.template == server.serving.props()["chat_template"]
    assert shown.template
    assert shown.modelinfo is not None
    assert shown.modelinfo[f"{said['general.architecture']}.context_length"] == server.model.context_tokens


def test_the_loaded_model_is_running_with_its_context(local: ollama.Client, server: RunningServer) -> None:
    (running,) = local.ps().models
    assert running.model == running.name == f"{server.model_id}:latest"
    assert running.context_length == server.model.context_tokens == 1024
    assert running.size == server.model.size_bytes > 0
    assert running.size_vram == 0  # the tests run on the CPU: no layer offloaded
    assert running.details is not None
    assert running.details.family
    assert running.expires_at is not None
    assert running.expires_at.timestamp() > time.time() + 365 * 24 * 3600  # loaded until the server stops


def test_chat_whole_and_streamed_agree_and_the_second_reuses_the_prompt(
    local: ollama.Client, server: RunningServer
) -> None:
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT + " (ollama)"},
        {"role": "user", "content": "Which lighthouse is the oldest?"},
    ]
    whole = local.chat(
        model=f"{server.model_id}:latest", messages=messages, options=OPTIONS, format=LONGER_THAN_THE_ANSWER
    )
    assert whole.done
    assert whole.message.content
    assert whole.message.content.startswith("[")
    assert whole.eval_count == 10
    assert whole.done_reason == "length"
    pieces = list(
        local.chat(
            model=server.model_id, messages=messages, options=OPTIONS, format=LONGER_THAN_THE_ANSWER, stream=True
        )
    )
    assert "".join(piece.message.content or "" for piece in pieces) == whole.message.content
    last = pieces[-1]
    assert last.done
    # As Ollama counts: prompt_eval_count is what was computed, far less the second time.
    assert whole.prompt_eval_count is not None
    assert last.prompt_eval_count is not None
    assert last.prompt_eval_count < whole.prompt_eval_count


def test_generate_whole_and_streamed_with_the_cached_count(local: ollama.Client, server: RunningServer) -> None:
    whole = local.generate(model=server.model_id, prompt="Name a colour.", system="Be brief.", options=OPTIONS)
    assert whole.response
    streamed = list(
        local.generate(model=server.model_id, prompt="Name a colour.", system="Be brief.", options=OPTIONS, stream=True)
    )
    assert "".join(piece.response or "" for piece in streamed) == whole.response
    body = {"model": server.model_id, "prompt": "Name a colour.", "system": "Be brief.", "stream": False}
    raw = httpx.post(f"{server.url}/api/generate", json={**body, "options": OPTIONS}, timeout=300)
    figures = raw.json()
    assert figures["response"] == whole.response
    assert figures["prompt_cache_count"] > 0
    assert figures["prompt_eval_count"] < whole.prompt_eval_count
    reused = int(raw.headers["x-chatapp-cache"].split(";")[0].removeprefix("reused="))
    assert reused == figures["prompt_cache_count"]


def test_errors_reach_the_client_as_ollama_errors(local: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as raised:
        local.chat(model="llama3", messages=[{"role": "user", "content": "hi"}])
    assert raised.value.status_code == 404
    assert "not served here" in raised.value.error


@pytest.mark.parametrize(
    ("count", "written"),
    [(134_515_008, "134.52M"), (7_000_000_000, "7B"), (8_030_261_248, "8.0B"), (0, "")],
)
def test_a_file_without_a_size_label_gets_its_parameter_count_as_ollama_writes_it(
    server: RunningServer, count: int, written: str
) -> None:
    model = dataclasses.replace(
        server.model, facts=dataclasses.replace(server.model.facts, size_label="", parameters=count)
    )
    assert ollama_models.details(model)["parameter_size"] == written


def test_top_k_is_honoured(local: ollama.Client, server: RunningServer) -> None:
    """top_k 1 leaves one candidate at every step: sampled at temperature 1, the answer is the greedy one."""
    question = "Name a colour (top_k)."
    greedy = local.generate(model=server.model_id, prompt=question, options={"temperature": 0, "num_predict": 8})
    cut = local.generate(
        model=server.model_id, prompt=question, options={"temperature": 1.0, "top_k": 1, "seed": 3, "num_predict": 8}
    )
    assert cut.response == greedy.response
    assert cut.response
