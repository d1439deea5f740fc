"""`chatapp serve --backend URL`: a chatapp server in front of another, asked with the official OpenAI client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import ollama
import openai
import pytest

from chatapp.benchmark.server_process import free_port
from chatapp.cli import main
from tests.server_support import (
    SHORT_ANSWER_TOKENS,
    SYSTEM_PROMPT,
    Backend,
    RunningServer,
    dying_mid_answer,
    running_server,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory, model_path: Path, backend: Backend) -> Iterator[RunningServer]:
    data = tmp_path_factory.mktemp("front-data")
    # No answer length of its own: a request without one is sent on without one.
    with running_server(
        data, model_path, backend=backend.url, backend_key=backend.key, default_max_tokens=None
    ) as running:
        yield running


def test_a_front_server_answers_from_the_backend_and_reports_its_cached_tokens(
    front: RunningServer, backend: Backend
) -> None:
    assert front.serving.engine.info.server == backend.url
    question = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Name a lighthouse."}]
    with openai.OpenAI(base_url=f"{front.url}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        model = client.models.list().data[0].id
        # ignore_eos (sent on to the backend): the answer cannot end before its length on any CPU.
        first = client.chat.completions.create(
            model=model, messages=question, temperature=0, extra_body={"ignore_eos": True}
        )
        answer = first.choices[0].message.content
        assert answer
        # The front sent no max_tokens: the backend answered with its own default length.
        assert first.usage is not None
        assert first.usage.completion_tokens == SHORT_ANSWER_TOKENS
        assert first.choices[0].finish_reason == "length"
        follow_up = [*question, {"role": "assistant", "content": answer}, {"role": "user", "content": "Why?"}]
        stream = client.chat.completions.create(
            model=model,
            messages=follow_up,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    usage = chunks[-1].usage
    assert text
    assert usage is not None
    assert usage.prompt_tokens_details is not None
    # The front server sent the backend the exact ids it generated for the first answer, so the
    # backend's cache held the whole first exchange.
    assert usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


def test_a_front_server_describes_what_it_knows_of_the_backends_model(front: RunningServer, backend: Backend) -> None:
    shown = ollama.Client(host=front.url, timeout=300).show(front.model_id)
    # The backend's template and context come through; the GGUF's own facts stay on the backend.
    assert shown.template == backend.server.model.template
    assert shown.template
    assert shown.modelinfo is not None
    assert shown.modelinfo["general.context_length"] == backend.server.model.context_tokens
    assert shown.details is not None
    assert shown.details.family == ""
    assert shown.details.quantization_level == ""
    assert shown.capabilities == ["completion", "tools"]


def test_a_backend_dying_mid_answer_ends_the_clients_stream_with_an_error_and_the_next_request_works(
    front: RunningServer, backend: Backend
) -> None:
    question = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
    with openai.OpenAI(base_url=f"{front.url}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        model = client.models.list().data[0].id
        received: list[object] = []
        with dying_mid_answer(backend):
            stream = client.chat.completions.create(model=model, messages=question, max_tokens=40, stream=True)
            with pytest.raises(openai.APIError) as raised:
                received.extend(stream)
        assert "the answer failed" in str(raised.value)
        assert "broke" in str(raised.value)
        assert received, "what came before the cut reached the client"
        again = client.chat.completions.create(model=model, messages=question, max_tokens=8, temperature=0)
        assert again.choices[0].message.content


@pytest.mark.parametrize(
    ("wrong", "expected"),
    [("key", "refused the API key (HTTP 401); set --backend-key"), ("address", "cannot reach the engine at")],
)
def test_serve_with_a_wrong_key_or_an_unreachable_backend_is_one_line_and_exit_2(
    data_dir: Path, capsys: pytest.CaptureFixture[str], backend: Backend, wrong: str, expected: str
) -> None:
    url, key = (backend.url, "wrong") if wrong == "key" else (f"http://127.0.0.1:{free_port()}", "unused")
    assert main(["serve", "--port", str(free_port()), "--backend", url, "--backend-key", key]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("chatapp: error")]
    assert len(errors) == 1
    assert expected in errors[0]


def test_tool_calls_and_formats_hold_through_the_backend(front: RunningServer) -> None:
    """The front builds the prompt (tools taught) and the grammar; the backend holds its answer to it."""
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            # A bounded string: the call ends within max_tokens whatever the model writes on this CPU.
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 24}},
                "required": ["city"],
            },
        },
    }
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    with openai.OpenAI(base_url=f"{front.url}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        model = client.models.list().data[0].id
        called = client.chat.completions.create(
            model=model, messages=question, tools=[weather], tool_choice="required", temperature=0, max_tokens=100
        )
        shaped = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Return a JSON object with the keys city and country for Paris."}],
            response_format={"type": "json_object"},
            temperature=0,
            max_tokens=100,
        )
    (call,) = called.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    assert isinstance(json.loads(shaped.choices[0].message.content or ""), dict)
