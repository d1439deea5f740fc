"""The Ollama API driven by the official `ollama` client against a real server on the bundled model."""

from __future__ import annotations

import httpx
import ollama
import pytest

from tests.server_support import SYSTEM_PROMPT, RunningServer

OPTIONS = {"temperature": 0, "num_predict": 10}


@pytest.fixture
def local(server: RunningServer) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=300)


def test_the_served_model_is_listed_with_a_version(local: ollama.Client, server: RunningServer) -> None:
    names = [model.model for model in local.list().models]
    assert names == [f"{server.model_id}:latest"]
    assert httpx.get(f"{server.url}/api/version").json()["version"]
    shown = local.show(f"{server.model_id}:latest")
    assert shown.capabilities == ["completion"]
    assert shown.modelinfo is not None


def test_chat_whole_and_streamed_agree_and_the_second_reuses_the_prompt(
    local: ollama.Client, server: RunningServer
) -> None:
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT + " (ollama)"},
        {"role": "user", "content": "Which lighthouse is the oldest?"},
    ]
    whole = local.chat(model=f"{server.model_id}:latest", messages=messages, options=OPTIONS)
    assert whole.done
    assert whole.message.content
    assert whole.eval_count == 10
    assert whole.done_reason == "length"
    pieces = list(local.chat(model=server.model_id, messages=messages, options=OPTIONS, stream=True))
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
