"""Bad requests get a 4xx with an OpenAI-shaped (or Ollama-shaped) error naming the problem; the server stays up."""

from __future__ import annotations

import re
from typing import Any

import httpx
import ollama
import openai
import pytest

from tests.server_support import RunningServer

MODEL = "{model}"  # replaced by the served model's id
USER = {"role": "user", "content": "Hello"}
TOO_LONG = "lighthouse " * 1200  # over the tests' 1,024-token context
A_CALL: dict[str, Any] = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
CALL: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [A_CALL]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [USER], **fields}


CASES = [
    ("/v1/chat/completions", chat(tools=[{"type": "retrieval"}]), 400, "tools[0]"),
    ("/v1/chat/completions", chat(tool_choice="required"), 400, "tool_choice"),
    ("/v1/chat/completions", chat(n=2), 400, "n"),
    ("/v1/chat/completions", chat(logprobs=True), 400, "logprobs"),
    ("/v1/chat/completions", chat(response_format={"type": "yaml"}), 400, "response_format"),
    ("/v1/chat/completions", chat(frequency_penalty=0.5), 400, "frequency_penalty"),
    (
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        400,
        "messages[0].content",
    ),
    ("/v1/chat/completions", chat(messages=[]), 400, "messages"),
    ("/v1/chat/completions", chat(messages=[{"role": "user", "content": "  "}]), 400, "messages[0]"),
    ("/v1/chat/completions", chat(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages[0].role"),
    ("/v1/chat/completions", chat(messages="hello"), 400, "messages"),
    ("/v1/chat/completions", chat(temperature="hot"), 400, "temperature"),
    (
        "/v1/chat/completions",
        chat(messages=[USER, {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}, USER]),
        400,
        "messages[1].tool_calls",
    ),
    ("/v1/chat/completions", chat(temperature=-1), 400, "temperature"),
    ("/v1/chat/completions", chat(max_tokens=0), 400, "max_tokens"),
    ("/v1/chat/completions", chat(max_tokens=10**9), 400, "max_tokens"),
    ("/v1/chat/completions", chat(seed=2**40), 400, "seed"),
    ("/v1/chat/completions", chat(model="gpt-4o"), 404, "model"),
    ("/v1/chat/completions", {"messages": [USER]}, 400, "model"),
    ("/v1/chat/completions", chat(messages=[{"role": "user", "content": TOO_LONG}]), 400, "messages"),
    ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "echo": True}, 400, "echo"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 2, 10**9]}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, -5]}, 400, "prompt"),
    ("/api/chat", {"model": MODEL, "messages": [USER], "tools": [{"type": "function"}]}, 400, None),
    ("/api/chat", {"model": MODEL, "messages": [USER], "format": "yaml"}, 400, None),
    ("/api/generate", {"model": MODEL, "prompt": "hi", "tools": [{"type": "function"}]}, 400, None),
    # A trigger pattern std::regex could choke on (its errors would end the process) is refused.
    (
        "/completion",
        {
            "prompt": [1, 2],
            "grammar": 'root ::= "a"',
            "grammar_lazy": True,
            "grammar_triggers": [{"type": 3, "value": "("}],
        },
        400,
        "grammar_triggers",
    ),
    ("/completion", {"prompt": [1, 2], "grammar": 'root ::= "a"', "grammar_lazy": True}, 400, "grammar_lazy"),
    ("/api/generate", {"model": MODEL, "prompt": "hi", "raw": True, "format": "json"}, 400, None),
    (
        "/v1/completions",
        {"model": MODEL, "prompt": "a", "response_format": {"type": "json_object"}},
        400,
        "response_format",
    ),
    ("/v1/chat/completions", chat(tool_choice={"function": "x"}), 400, "tool_choice"),
    (
        "/v1/chat/completions",
        chat(response_format={"type": "json_schema", "json_schema": "abc"}),
        400,
        "response_format",
    ),
    ("/v1/chat/completions", chat(response_format="json_object"), 400, "response_format"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, 400, None),
    ("/api/chat", {"model": MODEL, "messages": [USER], "options": {"min_p": 0.1}}, 400, None),
    ("/api/chat", {"model": "llama3", "messages": [USER]}, 404, None),
    ("/api/generate", {"model": MODEL, "prompt": " "}, 400, None),
    ("/api/chat", {"model": MODEL, "messages": [USER], "keep_alive": "soon"}, 400, "keep_alive"),
    ("/api/generate", {"model": "llama3", "prompt": ""}, 404, None),
    # Tool histories that no model could have written: OpenAI answers these with a 400 too.
    ("/v1/chat/completions", chat(messages=[USER, RESULT]), 400, "messages[1]"),
    (
        "/v1/chat/completions",
        chat(messages=[USER, CALL, {**RESULT, "tool_call_id": "call_9"}]),
        400,
        "messages[2].tool_call_id",
    ),
    (
        "/v1/chat/completions",
        chat(
            messages=[
                USER,
                {**CALL, "tool_calls": [{**A_CALL, "function": {"name": "f", "arguments": "{x"}}]},
            ]
        ),
        400,
        "messages[1].tool_calls[0].function.arguments",
    ),
    ("/v1/chat/completions", chat(parallel_tool_calls="yes"), 400, "parallel_tool_calls"),
    ("/api/chat", {"model": MODEL, "messages": [USER, {"role": "tool", "content": "12 C"}]}, 400, None),
    ("/v1/chat/completions", chat(reasoning_effort="extreme"), 400, "reasoning_effort"),
    ("/v1/chat/completions", chat(reasoning_effort=["low"]), 400, "reasoning_effort"),
    ("/api/chat", {"model": MODEL, "messages": [USER], "think": "very"}, 400, None),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), CASES)
def test_bad_requests_get_a_clear_error(
    http: httpx.Client, server: RunningServer, path: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    body = {key: server.model_id if value == MODEL else value for key, value in body.items()}
    response = http.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    if path.startswith("/api/"):
        assert isinstance(error, str)
        assert error
    else:
        assert error["message"]
        assert "\n" not in error["message"]
        assert error["param"] == param, error
    assert "Traceback" not in response.text


def test_malformed_json_and_wrong_shapes(http: httpx.Client) -> None:
    for path in ("/v1/chat/completions", "/api/chat"):
        response = http.post(path, content=b"{not json", headers={"content-type": "application/json"})
        assert response.status_code == 400
        assert "not valid JSON" in str(response.json()["error"])
        response = http.post(path, json=[1, 2])
        assert response.status_code == 400
        assert "JSON object" in str(response.json()["error"])


def test_deeply_nested_json_is_a_bad_request(http: httpx.Client) -> None:
    nested = b"[" * 100_000 + b"]" * 100_000
    for path in ("/v1/chat/completions", "/api/chat"):
        response = http.post(path, content=nested, headers={"content-type": "application/json"})
        assert response.status_code == 400
        assert "nests too deeply" in str(response.json()["error"])


def test_a_body_over_the_limit_is_refused(http: httpx.Client, server: RunningServer) -> None:
    limit = server.context.body_limit_bytes
    body = {"model": server.model_id, "messages": [{"role": "user", "content": "x" * (limit + 1)}]}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 413
    assert f"{limit:,} bytes" in response.json()["error"]["message"]


def test_unknown_routes_and_methods_answer_in_the_api_shape(http: httpx.Client) -> None:
    missing = http.get("/v1/engines")
    assert missing.status_code == 404
    assert "no route /v1/engines" in missing.json()["error"]["message"]
    wrong_method = http.get("/v1/chat/completions")
    assert wrong_method.status_code == 405
    assert isinstance(http.delete("/api/chat").json()["error"], str)


def test_the_server_still_answers_after_bad_requests(http: httpx.Client, server: RunningServer) -> None:
    http.post("/v1/chat/completions", content=b"\xff\xfe")
    response = http.post("/v1/chat/completions", json={"model": server.model_id, "messages": [USER]})
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"]


def test_embeddings_are_refused_with_a_501_that_says_why(client: openai.OpenAI, server: RunningServer) -> None:
    with pytest.raises(openai.APIStatusError) as refused:
        client.embeddings.create(model=server.model_id, input="a lighthouse")
    assert refused.value.status_code == 501
    assert "does not compute embeddings" in refused.value.message
    local = ollama.Client(host=server.url, timeout=300)
    for ask in (
        lambda: local.embed(model=server.model_id, input="a lighthouse"),
        lambda: local.embeddings(model=server.model_id, prompt="a lighthouse"),
    ):
        with pytest.raises(ollama.ResponseError) as answered:
            ask()
        assert answered.value.status_code == 501
        assert "does not compute embeddings" in answered.value.error


UNCOMPILABLE = {"type": "string", "pattern": "^a{0,2000}$"}  # converted, then refused by llama.cpp's parser


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/chat/completions",
            chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": UNCOMPILABLE}}),
            "response_format.json_schema.schema",
        ),
        (
            "/v1/chat/completions",
            chat(
                stream=True,
                tools=[
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": UNCOMPILABLE}}},
                    }
                ],
                tool_choice="required",
            ),
            "tools",
        ),
        ("/api/chat", {"model": MODEL, "messages": [USER], "format": UNCOMPILABLE, "stream": True}, None),
    ],
    ids=["response-format", "streamed-tools", "ollama-format"],
)
def test_a_schema_llama_cpp_cannot_compile_is_a_400_before_any_prompt_is_computed(
    http: httpx.Client, server: RunningServer, path: str, body: dict[str, Any], param: str | None
) -> None:
    assert server.engine.cache is not None
    before = server.engine.cache.stats()["requests"]
    body = {key: server.model_id if value == MODEL else value for key, value in body.items()}
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    message = error if isinstance(error, str) else error["message"]
    assert "llama.cpp refused" in message
    assert "simplify" in message
    if param is not None:
        assert error["param"] == param
    assert server.engine.cache.stats()["requests"] == before, "nothing was computed"


def test_a_prompt_over_the_context_is_told_as_agents_recognise_it(http: httpx.Client, server: RunningServer) -> None:
    """Agents compact their history on these: OpenAI's code, Anthropic's "prompt is too long: N tokens > M"."""
    too_long = [{"role": "user", "content": TOO_LONG}]
    openai_error = http.post("/v1/chat/completions", json=chat(model=server.model_id, messages=too_long)).json()
    assert openai_error["error"]["code"] == "context_length_exceeded"
    responses_error = http.post("/v1/responses", json={"model": server.model_id, "input": TOO_LONG}).json()
    assert responses_error["error"]["code"] == "context_length_exceeded"
    body = {"model": server.model_id, "max_tokens": 4, "messages": too_long}
    anthropic_error = http.post("/v1/messages", json=body).json()
    assert re.match(r"prompt is too long: \d+ tokens > \d+ maximum", anthropic_error["error"]["message"])
