"""The OpenAI API driven by the official `openai` client against a real server on the bundled model."""

from __future__ import annotations

import json
import re
from typing import Any

import openai
import pytest

from chatapp.services.prompt_plan import builder_of
from tests.server_support import SYSTEM_PROMPT, RunningServer

QUESTION = "Which lighthouse is the oldest?"
# llama-server's and vLLM's extension, sent through the client's extra_body: the answer cannot end before its
# length, so its finish reason and token count are the same on every CPU.
NEVER_ENDS = {"ignore_eos": True}


def cache_header(headers: Any) -> dict[str, str]:
    """`X-Chatapp-Cache: reused=..; computed=..; tier=..` as a dict."""
    value = headers.get("x-chatapp-cache")
    assert value is not None, "every answer says what the cache did"
    return dict(part.strip().split("=", 1) for part in value.split(";"))


def chat(client: openai.OpenAI, server: RunningServer, messages: list[dict[str, str]], **options: Any) -> Any:
    """A whole chat answer, with the cache header kept beside it."""
    raw = client.chat.completions.with_raw_response.create(
        model=server.model_id, messages=messages, temperature=0, **options
    )
    completion = raw.parse()
    completion.cache = cache_header(raw.headers)
    return completion


def test_the_served_model_is_listed(client: openai.OpenAI, server: RunningServer) -> None:
    models = client.models.list()
    assert [model.id for model in models.data] == [server.model_id]


def test_a_streamed_answer_equals_the_whole_one_with_the_same_usage(
    client: openai.OpenAI, server: RunningServer
) -> None:
    messages = [{"role": "system", "content": SYSTEM_PROMPT + " (stream)"}, {"role": "user", "content": QUESTION}]
    whole = chat(client, server, messages, extra_body=NEVER_ENDS)
    stream = client.chat.completions.create(
        model=server.model_id,
        messages=messages,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=NEVER_ENDS,
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert whole.choices[0].message.content
    assert "".join(pieces) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason == "length"  # the server's --max-tokens 12
    assert usage is not None
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage.completion_tokens == whole.usage.completion_tokens == 12
    # The second request found the first one's prompt: all of it but the fresh tokens at its end.
    assert usage.prompt_tokens_details.cached_tokens > whole.usage.prompt_tokens - 8
    assert whole.usage.prompt_tokens_details.cached_tokens == int(whole.cache["reused"])


def test_cached_tokens_are_the_reused_system_prompt(client: openai.OpenAI, server: RunningServer) -> None:
    system = {"role": "system", "content": SYSTEM_PROMPT + " (cached tokens)"}
    first = chat(client, server, [system, {"role": "user", "content": QUESTION}])
    second = chat(client, server, [system, {"role": "user", "content": "And the tallest one?"}])
    assert first.usage.prompt_tokens_details.cached_tokens == int(first.cache["reused"])
    reused = second.usage.prompt_tokens_details.cached_tokens
    assert reused == int(second.cache["reused"])
    assert int(second.cache["computed"]) == second.usage.prompt_tokens - reused
    assert second.cache["tier"] != "none"
    # The system prompt (more than one cache block) is reused, the new question is not.
    assert 64 <= reused < second.usage.prompt_tokens
    assert reused > first.usage.prompt_tokens_details.cached_tokens


def test_a_conversation_sent_back_as_text_reuses_its_answer(client: openai.OpenAI, server: RunningServer) -> None:
    messages = [{"role": "system", "content": SYSTEM_PROMPT + " (history)"}, {"role": "user", "content": QUESTION}]
    first = chat(client, server, messages)
    answer = first.choices[0].message.content
    follow_up = [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": "Why?"}]
    # Once the answer is in the KV (its tokens computed again as a prompt is, after the reply;
    # a request arriving first would stop that and compute them itself)...
    server.serving.engine.flush_cache()
    second = chat(client, server, follow_up)
    # ...the first prompt and the answer's tokens (all but the last, never evaluated) come back.
    expected = first.usage.prompt_tokens + first.usage.completion_tokens - 1
    assert second.usage.prompt_tokens_details.cached_tokens >= expected


def test_a_stop_string_ends_the_answer_before_it(client: openai.OpenAI, server: RunningServer) -> None:
    messages = [{"role": "user", "content": "Describe a lighthouse at night."}]
    free = chat(client, server, messages).choices[0].message.content
    words = re.findall(r"[A-Za-z]{4,}", free)
    assert len(words) >= 2, free
    stop = words[1]
    cut = chat(client, server, messages, stop=[stop, "never-appears"])
    assert cut.choices[0].message.content == free[: free.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(
        model=server.model_id, messages=messages, temperature=0, stop=stop, stream=True
    )
    text = "".join(choice.delta.content or "" for chunk in streamed for choice in chunk.choices)
    assert text == free[: free.index(stop)]


def test_plain_completions_whole_and_streamed(client: openai.OpenAI, server: RunningServer) -> None:
    prompt = "The three primary colours are"
    asked: dict[str, Any] = {"model": server.model_id, "temperature": 0, "max_tokens": 8, "extra_body": NEVER_ENDS}
    whole = client.completions.create(prompt=prompt, **asked)
    assert whole.choices[0].text
    assert whole.usage is not None
    assert whole.usage.completion_tokens == 8
    assert whole.choices[0].finish_reason == "length"
    stream = client.completions.create(prompt=prompt, stream=True, **asked)
    assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == whole.choices[0].text
    # The same prompt as token ids (what benchmarks send): the same answer, all of it reused.
    ids = builder_of(server.serving.engine).tokenize(prompt, add_special=True, parse_special=True)
    by_ids = client.completions.create(prompt=ids, **asked)
    assert by_ids.choices[0].text == whole.choices[0].text
    assert by_ids.usage.prompt_tokens == whole.usage.prompt_tokens


def test_a_prompt_that_breaks_the_prefix_says_where(client: openai.OpenAI, server: RunningServer) -> None:
    answers = []
    for stamp in ("10:41:07", "10:42:13"):
        system = {"role": "system", "content": f"It is now {stamp}. " + SYSTEM_PROMPT}
        raw = client.chat.completions.with_raw_response.create(
            model=server.model_id, messages=[system, {"role": "user", "content": QUESTION}], temperature=0
        )
        answers.append(raw.headers)
    figures = cache_header(answers[1])
    position = int(figures["diverged_at"])
    # The earlier prompt is still in a sequence: every token up to the divergence is reused, no more.
    assert figures["tier"] == "device"
    assert int(figures["reused"]) == position
    excerpt = json.loads(answers[1]["x-chatapp-cache-divergence"])
    assert excerpt["after"].startswith("2:13")
    assert "It is now 10:4" in excerpt["before"]
    assert set(excerpt) == {"before", "after", "place"}  # the earlier prompt may be another client's: log only
    assert excerpt["place"] == "line 1 of the system prompt"


def test_ignore_eos_with_a_response_format_is_a_400_naming_it(client: openai.OpenAI, server: RunningServer) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        chat(
            client,
            server,
            [{"role": "user", "content": QUESTION}],
            response_format={"type": "json_object"},
            extra_body=NEVER_ENDS,
        )
    assert refused.value.status_code == 400
    assert "ignore_eos cannot be combined" in refused.value.message


def test_reasoning_effort_is_accepted_on_a_model_without_reasoning(
    client: openai.OpenAI, server: RunningServer
) -> None:
    """Agents and benchmarks send it (`"none"` too); a model with no reasoning switch answers as without it."""
    messages = [{"role": "user", "content": QUESTION}]
    plain = chat(client, server, messages, max_tokens=4, extra_body=NEVER_ENDS)
    for effort in ("none", "high"):
        asked = chat(client, server, messages, max_tokens=4, reasoning_effort=effort, extra_body=NEVER_ENDS)
        assert asked.choices[0].message.content == plain.choices[0].message.content
