"""A request that sets no answer length is answered until the model ends it or the context is full,
as OpenAI, Ollama and llama-server answer: not cut at the chat screen's answer length."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.server_support import RunningServer, running_server

CONTEXT = 256  # small, so that an answer reaches the context's end in seconds
COUNT = "Count from 1 to 1000, separated by commas."
# Whether the model would end the count by itself differs between CPUs (greedy answers do): each
# answer is held so that it cannot end before the context does. OpenAI's clients send `ignore_eos`
# (llama-server's and vLLM's extension); Ollama has no such option, so its answer must be a JSON
# list of more numbers than the context holds (no token of this vocabulary holds two digits).
NEVER_ENDS = {"ignore_eos": True}
LONGER_THAN_THE_CONTEXT = {"type": "array", "items": {"type": "integer"}, "minItems": 300}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[RunningServer]:
    # No --max-tokens; the settings' max_tokens (the chat screen's answer length) is short, and not the server's.
    data = tmp_path_factory.mktemp("server-data")
    with running_server(data, model_path, default_max_tokens=None, context_cap=CONTEXT, max_tokens=12) as running:
        yield running


def test_an_openai_request_without_max_tokens_is_answered_to_the_end_of_the_context(
    client: openai.OpenAI, server: RunningServer
) -> None:
    answer = client.chat.completions.create(
        model=server.model_id, messages=[{"role": "user", "content": COUNT}], temperature=0, extra_body=NEVER_ENDS
    )
    usage = answer.usage
    assert usage is not None
    assert answer.choices[0].finish_reason == "length"
    assert usage.completion_tokens > 12
    # The last token is handed out without a place in the context: the answer fills all of it.
    assert usage.prompt_tokens + usage.completion_tokens >= CONTEXT


@pytest.mark.parametrize("predict", [None, -1], ids=["no-num-predict", "num-predict-minus-1"])
def test_an_ollama_request_without_a_limit_is_answered_to_the_end_of_the_context(
    server: RunningServer, predict: int | None
) -> None:
    options = {} if predict is None else {"num_predict": predict}
    body = {
        "model": server.model_id,
        "prompt": COUNT,
        "stream": False,
        "options": options,
        "format": LONGER_THAN_THE_CONTEXT,
    }
    answer = httpx.post(f"{server.url}/api/generate", json=body, timeout=300).json()
    assert answer["done_reason"] == "length"
    assert answer["response"].startswith("["), "held to the format"
    prompt_tokens = answer["prompt_eval_count"] + answer["prompt_cache_count"]
    assert prompt_tokens + answer["eval_count"] >= CONTEXT
