"""`chatapp serve --model-alias NAME` and `--any-model`: clients with a model name built in
(the OpenAI Agents SDK's default, aider's gpt-4o) are answered by the served model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import ollama
import openai
import pytest

from tests.server_support import RunningServer, running_server

ALIASES = ("gpt-4o", "gpt-4.1-mini")
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("server-data"), model_path, aliases=ALIASES) as running:
        yield running


def test_the_aliases_are_listed_and_answered_by_both_apis(client: openai.OpenAI, server: RunningServer) -> None:
    assert [model.id for model in client.models.list().data] == [server.model_id, *ALIASES]
    answer = client.chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=4)
    assert answer.model == "gpt-4o"
    assert answer.choices[0].message.content
    local = ollama.Client(host=server.url, timeout=300)
    assert [model.model for model in local.list().models] == [
        f"{server.model_id}:latest",
        "gpt-4o:latest",
        "gpt-4.1-mini:latest",
    ]
    # One model is loaded, whatever its names: /api/ps lists it once, under its id.
    assert [model.model for model in local.ps().models] == [f"{server.model_id}:latest"]
    reply = local.chat(model="gpt-4.1-mini:latest", messages=HELLO, options={"num_predict": 4})
    assert reply.message.content
    assert local.show("gpt-4o").details == local.show(server.model_id).details


def test_another_name_is_refused_with_the_names_served(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as refused:
        client.chat.completions.create(model="claude-3", messages=HELLO, max_tokens=4)
    assert "'claude-3' is not served here" in str(refused.value)
    assert "'gpt-4o'" in str(refused.value)


def test_any_model_answers_whatever_name_a_request_gives(tmp_path: Path, model_path: Path) -> None:
    with (
        running_server(tmp_path / "data", model_path, any_model=True) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300) as client,
    ):
        assert [model.id for model in client.models.list().data] == [server.model_id]
        answer = client.chat.completions.create(model="o3-pro", messages=HELLO, max_tokens=4)
        assert answer.model == "o3-pro"
        assert answer.choices[0].message.content
        reply = ollama.Client(host=server.url, timeout=300).chat(model="llama3:8b", messages=HELLO)
        assert reply.message.content
