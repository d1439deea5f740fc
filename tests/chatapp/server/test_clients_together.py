"""Several clients at once, a client that hangs up, a full queue: each answered right, or told why not."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import httpx
import openai
import pytest

from chatapp.engine.gate import Step
from tests.server_support import SYSTEM_PROMPT, RunningServer

QUESTIONS = ["Which lighthouse is the oldest?", "How tall are lighthouses?", "Who keeps a lighthouse?", "Why flash?"]
WAIT_S = 120.0


def ask(client: openai.OpenAI, server: RunningServer, question: str) -> tuple[str, Any]:
    completion = client.chat.completions.create(
        model=server.model_id,
        messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}],
        temperature=0,
    )
    return completion.choices[0].message.content or "", completion.usage


def wait_for(condition: Any) -> None:
    """Poll a condition the server reaches on its own; the deadline only guards against a hang."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "the server never got there"
        time.sleep(0.01)


# An answer a test holds at its n-th token must not end before it, on any CPU: its end tokens are forbidden.
HELD = {"ignore_eos": True}


@contextmanager
def raw_story_request(server: RunningServer) -> Iterator[None]:
    """A whole-answer chat request on a bare socket, hung up when the block ends (no client cleanup between)."""
    host, port = server.url.removeprefix("http://").split(":")
    story = {"model": server.model_id, "messages": [{"role": "user", "content": "Tell me a story."}], **HELD}
    body = json.dumps(story).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(head.encode() + body)
        yield


@contextmanager
def streamed_story_request(http: httpx.Client, server: RunningServer) -> Iterator[None]:
    """A streamed chat request, hung up when the block ends, where it must be the one request pending."""
    body = {
        "model": server.model_id,
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "stream": True,
        **HELD,
    }
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        yield
        assert server.serving.completions.pending == 1


# How a client hangs up in the middle of its request: (http, server) -> a block the request is open in.
HANG_UPS: dict[str, Callable[[httpx.Client, RunningServer], AbstractContextManager[None]]] = {
    "mid-stream": streamed_story_request,
    "before-a-whole-answer": lambda http, server: raw_story_request(server),
}


def test_four_clients_at_once_each_get_their_own_answer(client: openai.OpenAI, server: RunningServer) -> None:
    alone = [ask(client, server, question) for question in QUESTIONS]
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        together = list(pool.map(lambda question: ask(client, server, question), QUESTIONS))
    for (text_alone, usage_alone), (text, usage) in zip(alone, together, strict=True):
        # Exact for one client at a time, and so for each of several: the engine runs one
        # sequence per step, in the batches it would use alone.
        assert text == text_alone
        assert usage.prompt_tokens == usage_alone.prompt_tokens
        assert usage.completion_tokens == usage_alone.completion_tokens
        assert 0 < usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens


@pytest.mark.parametrize(
    ("hang_up", "question"), [("mid-stream", QUESTIONS[0]), ("before-a-whole-answer", QUESTIONS[1])]
)
def test_a_client_that_hangs_up_frees_its_request(
    hang_up: str, question: str, http: httpx.Client, client: openai.OpenAI, server: RunningServer
) -> None:
    engine = server.engine
    with engine.holding(Step.TOKEN, 2) as gate:
        with HANG_UPS[hang_up](http, server):
            assert gate.wait_until_holding()
        # The connection is closed while the answer is held: the request is cancelled, which
        # ends the hold without the test releasing it.
        wait_for(lambda: not gate.holding.is_set() and server.serving.completions.pending == 0)
    text, _ = ask(client, server, question)
    assert text


def test_a_client_that_hangs_up_while_waiting_its_turn_frees_its_place(
    http: httpx.Client, server: RunningServer
) -> None:
    engine = server.engine
    completions = server.serving.completions
    first = {"model": server.model_id, "messages": [{"role": "user", "content": "Hello"}], "stream": True, **HELD}
    with engine.holding(Step.TOKEN, 1) as gate, http.stream("POST", "/v1/chat/completions", json=first) as running:
        assert gate.wait_until_holding()  # the engine thread is held: nothing else can start
        with raw_story_request(server):
            wait_for(lambda: completions.pending == 2)
        # Hung up before its turn: its place is free while the first answer is still held.
        wait_for(lambda: completions.pending == 1)
        gate.release()
        assert "data: [DONE]" in running.read().decode()
    wait_for(lambda: completions.pending == 0)


def test_over_the_pending_limit_a_client_is_told_to_retry(http: httpx.Client, server: RunningServer) -> None:
    engine = server.engine
    completions = server.serving.completions
    body = {"model": server.model_id, "messages": [{"role": "user", "content": "Hello"}], "stream": True, **HELD}
    limit = completions.max_pending
    completions.max_pending = 1
    try:
        with engine.holding(Step.TOKEN, 1) as gate, http.stream("POST", "/v1/chat/completions", json=body) as first:
            assert first.status_code == 200
            assert gate.wait_until_holding()
            refused = http.post("/v1/chat/completions", json={**body, "stream": False})
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            assert "retry shortly" in refused.json()["error"]["message"]
            gate.release()
            assert "data: [DONE]" in first.read().decode()
    finally:
        completions.max_pending = limit
    assert http.post("/v1/chat/completions", json={**body, "stream": False}).status_code == 200
