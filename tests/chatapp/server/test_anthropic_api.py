"""Anthropic's Messages API driven by the official `anthropic` SDK against a real server on the bundled model:
whole and streamed answers, tool use and the loop back, usage that says what the cache did, errors."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from chatapp.server import anthropic_fields as fields
from chatapp.services.pins import PinKeeper
from chatapp.vocabulary import Role
from tests.server_support import SYSTEM_PROMPT, RunningServer, running_server

API_KEY = "anthropic-test-key"
QUESTION = "Which lighthouse is the oldest?"
NEVER_ENDS = {"ignore_eos": True}  # as on the OpenAI routes: the answer's length is the same on every CPU
# No temperature is sent: the test server's settings are greedy (and this SDK no longer sends one).
WEATHER_TOOL: Any = {
    "name": "get_weather",
    "description": "The weather now in a city.",
    # A bounded string: the call ends within max_tokens whatever the model writes on this CPU.
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[RunningServer]:
    """A server with a key (sent as x-api-key by the SDK) that answers to any model name, as Claude Code needs."""
    data = tmp_path_factory.mktemp("anthropic-data")
    with running_server(data, model_path, api_key=API_KEY, any_model=True) as running:
        yield running


@pytest.fixture
def claude(server: RunningServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=300) as opened:
        yield opened


def test_a_whole_answer_and_a_streamed_one_agree_and_the_second_reuses_the_prompt(
    claude: anthropic.Anthropic,
) -> None:
    asked: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 12,
        "system": [{"type": "text", "text": SYSTEM_PROMPT, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": QUESTION}],
        "extra_body": NEVER_ENDS,
    }
    whole = claude.messages.create(**asked)
    assert whole.type == "message"
    assert whole.role == "assistant"
    assert whole.stop_reason == "max_tokens"
    assert whole.usage.output_tokens == 12
    (block,) = whole.content
    assert block.type == "text"
    assert block.text
    with claude.messages.stream(**asked) as stream:
        streamed_text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed_text == block.text
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 12
    # What the cache did: the second found the first one's prompt; the three counts add up to the prompt.
    assert prompt_of(whole.usage) == prompt_of(final.usage)
    assert final.usage.cache_read_input_tokens is not None
    assert final.usage.cache_read_input_tokens > prompt_of(whole.usage) - 8
    assert final.usage.cache_creation_input_tokens == 0


def prompt_of(usage: anthropic.types.Usage) -> int:
    """Anthropic's three input counts add up to the prompt."""
    return usage.input_tokens + (usage.cache_creation_input_tokens or 0) + (usage.cache_read_input_tokens or 0)


def test_cache_control_pins_the_beginning_it_marks_until_its_time_is_up(
    claude: anthropic.Anthropic, server: RunningServer
) -> None:
    assert server.serving.pins is not None
    keeper = server.serving.pins.keeper
    system = SYSTEM_PROMPT + " Keep a log (cache_control test)."  # a whole block and more
    asked: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4,
        "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "Which lighthouse is the tallest?"},
            {"role": "assistant", "content": "The one at Ile Vierge."},
            {
                "role": "user",
                "content": [{"type": "text", "text": QUESTION, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            },
        ],
        "extra_body": NEVER_ENDS,
    }
    server.serving.pins.wait()  # pins earlier tests asked for are made before this one starts
    started = time.time()
    first = claude.messages.create(**asked)
    server.serving.pins.wait()
    mine = [pin for pin in keeper.store.list() if pin.kind == "request" and pin.created_at >= started]
    assert sorted(pin.expires_at - pin.created_at for pin in mine if pin.expires_at) == pytest.approx(
        [300, 3600], abs=5
    )
    through_question = max(len(pin.tokens) for pin in mine)
    # Computed now up to the last breakpoint, which here ends the prompt but for the assistant's header.
    assert first.usage.cache_creation_input_tokens == through_question - (first.usage.cache_read_input_tokens or 0)
    assert 0 < first.usage.input_tokens < 8
    assert server.engine.cache is not None
    assert server.engine.cache.stats()["pinned_entries"] > 0
    second = claude.messages.create(**asked)
    assert second.usage.cache_creation_input_tokens == 0
    assert second.usage.cache_read_input_tokens is not None
    assert second.usage.cache_read_input_tokens >= through_question, "the beginning kept was found again"
    server.serving.pins.wait()
    # An hour and a bit later both have ended, and what they held is no longer pinned.
    later = PinKeeper(server.engine.cache, keeper.store, clock=lambda: time.time() + 3700)
    assert later.sweep() >= 2
    assert not [pin for pin in keeper.store.list() if pin.kind == "request"]
    assert server.engine.cache.stats()["pinned_entries"] == 0


@pytest.mark.parametrize(
    ("control", "words"),
    [
        ({"type": "persistent"}, "must be {'type': 'ephemeral'}"),
        ({"type": "ephemeral", "ttl": "2d"}, "'5m' or '1h'"),
        ({"type": "ephemeral", "ttl": ["5m"]}, "'5m' or '1h'"),
    ],
)
def test_a_malformed_cache_control_is_a_400_naming_the_block(
    server: RunningServer, control: dict[str, Any], words: str
) -> None:
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": control}]}],
    }
    answer = httpx.post(f"{server.url}/v1/messages", json=body, headers={"x-api-key": API_KEY}, timeout=60)
    assert answer.status_code == 400
    message = answer.json()["error"]["message"]
    assert "messages[0].content[0].cache_control" in message
    assert words in message


def test_more_than_four_breakpoints_are_refused(server: RunningServer) -> None:
    marked = [{"type": "text", "text": f"part {n}", "cache_control": {"type": "ephemeral"}} for n in range(5)]
    body = {"model": "claude-sonnet-4-5", "max_tokens": 4, "messages": [{"role": "user", "content": marked}]}
    answer = httpx.post(f"{server.url}/v1/messages", json=body, headers={"x-api-key": API_KEY}, timeout=60)
    assert answer.status_code == 400
    assert "at most 4" in answer.json()["error"]["message"]


def test_a_tool_is_called_and_the_loop_back_reuses_the_call(claude: anthropic.Anthropic, server: RunningServer) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    asked: dict[str, Any] = {
        "model": "claude-haiku-4-5",
        "max_tokens": 120,
        "system": "You are a helpful assistant with tools (Anthropic).",
        "tools": [WEATHER_TOOL],
    }
    first = claude.messages.create(messages=messages, tool_choice={"type": "any"}, **asked)
    assert first.stop_reason == "tool_use"
    calls = [block for block in first.content if block.type == "tool_use"]
    assert len(calls) == 1
    call = calls[0]
    assert call.name == "get_weather"
    assert isinstance(call.input, dict)
    assert isinstance(call.input["city"], str)
    messages += [
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees and sunny"}],
        },
    ]
    server.serving.engine.flush_cache()  # the tool ran meanwhile: the call's tokens are in the KV
    with claude.messages.stream(messages=messages, **asked) as stream:
        second = stream.get_final_message()
    earlier = first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0) + first.usage.output_tokens - 1
    assert (second.usage.cache_read_input_tokens or 0) >= earlier, "the first prompt and the call are reused"
    assert second.usage.input_tokens < 40, "only the tool result and the turn's opening are computed"


def test_a_streamed_call_comes_as_a_tool_use_block_as_it_is_written(claude: anthropic.Anthropic) -> None:
    """The block begins once the function's name is known; its input follows in pieces (Claude Code's first event
    comes tokens after the call begins, not after the answer ends)."""
    events: list[Any] = []
    with claude.messages.stream(
        model="claude-haiku-4-5",
        max_tokens=120,
        messages=[{"role": "user", "content": "What is the weather in Rome?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
    ) as stream:
        events.extend(stream)
        final = stream.get_final_message()
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start"
    assert kinds[-1] == "message_stop"
    pieces = [event.delta.partial_json for event in events if event.type == "content_block_delta"]
    assert kinds.index("content_block_start") < kinds.index("content_block_delta")
    assert len(pieces) > 1, "the input comes as it is written, not whole at the end"
    (call,) = [block for block in final.content if block.type == "tool_use"]
    assert json.loads("".join(pieces)) == call.input
    assert call.name == "get_weather"
    assert isinstance(call.input["city"], str)
    assert final.stop_reason == "tool_use"


def test_structured_output_follows_the_schema_claude_code_sends_for_titles(claude: anthropic.Anthropic) -> None:
    """Claude Code asks for its session title as JSON (`output_config.format`): the text is that JSON."""
    schema = {
        "type": "object",
        "properties": {"title": {"type": "string", "maxLength": 20}},
        "required": ["title"],
        "additionalProperties": False,
    }
    answer = claude.messages.create(
        model="claude-haiku-4-5",
        max_tokens=60,
        messages=[{"role": "user", "content": "Give this session a title."}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    assert answer.stop_reason == "end_turn"
    (block,) = answer.content
    assert block.type == "text"
    value = json.loads(block.text)
    assert list(value) == ["title"]
    assert len(value["title"]) <= 20


def test_count_tokens_is_the_prompt_the_answer_is_computed_from(claude: anthropic.Anthropic) -> None:
    asked: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "system": "Count me (Anthropic).",
        "messages": [{"role": "user", "content": QUESTION}],
    }
    counted = claude.messages.count_tokens(**asked)
    answered = claude.messages.create(max_tokens=1, **asked)
    assert counted.input_tokens == prompt_of(answered.usage)
    with_tools = claude.messages.count_tokens(tools=[WEATHER_TOOL], **asked)
    assert with_tools.input_tokens > counted.input_tokens, "the tools are taught in the prompt"


@pytest.mark.parametrize(
    ("request_", "status", "kind", "words"),
    [
        ({"max_tokens": 8, "messages": [{"role": "robot", "content": "hi"}]}, 400, "invalid_request_error", "role"),
        (
            {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            400,
            "invalid_request_error",
            "'image'",
        ),
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "invalid_request_error", "max_tokens"),
        (
            {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "any"}},
            400,
            "invalid_request_error",
            "no tools",
        ),
        (
            {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "output_config": {"format": {}}},
            400,
            "invalid_request_error",
            "output_config.format must be",
        ),
        (
            {
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "hi"}],
                "output_config": {"format": {"type": "json_schema", "schema": {"enum": []}}},
            },
            400,
            "invalid_request_error",
            "output_config.format.schema",
        ),
    ],
    ids=["unknown-role", "image", "no-max-tokens", "choice-without-tools", "format-not-a-schema", "schema-no-grammar"],
)
def test_bad_requests_get_anthropics_error_shape(
    server: RunningServer, request_: dict[str, Any], status: int, kind: str, words: str
) -> None:
    body = {"model": "claude-sonnet-4-5", **request_}
    answer = httpx.post(f"{server.url}/v1/messages", json=body, headers={"x-api-key": API_KEY}, timeout=60)
    assert answer.status_code == status
    error = answer.json()
    assert error["type"] == "error"
    assert error["error"]["type"] == kind
    assert words in error["error"]["message"]
    assert "\n" not in error["error"]["message"]


def test_a_wrong_key_is_an_authentication_error(server: RunningServer) -> None:
    with (
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0) as wrong,
        pytest.raises(anthropic.AuthenticationError) as refused,
    ):
        wrong.messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 401
    body = refused.value.body
    assert isinstance(body, dict)
    assert json.dumps(body).count("authentication_error") == 1


def test_thinking_is_accepted_and_changes_nothing_on_a_model_without_a_switch(claude: anthropic.Anthropic) -> None:
    asked: dict[str, Any] = {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": QUESTION}]}
    plain = claude.messages.count_tokens(**asked)
    for thinking in ({"type": "enabled", "budget_tokens": 2048}, {"type": "disabled"}):
        assert claude.messages.count_tokens(thinking=thinking, **asked).input_tokens == plain.input_tokens  # type: ignore[arg-type]
    answered = claude.messages.create(max_tokens=2, thinking={"type": "disabled"}, extra_body=NEVER_ENDS, **asked)
    assert answered.usage.output_tokens == 2
    with pytest.raises(anthropic.BadRequestError, match="thinking"):
        claude.messages.create(max_tokens=2, thinking={"type": "enabled", "budget_tokens": 0}, **asked)


def claude_code_system(conversation: str, *, text: str = SYSTEM_PROMPT) -> Any:
    """The system blocks Claude Code 2.1.197 sends: its billing line, whose last three hex digits follow the
    conversation's first message, then its agent line and instructions (here a short stand-in)."""
    return [
        {
            "type": "text",
            "text": f"x-anthropic-billing-header: cc_version=2.1.197.{conversation}; cc_entrypoint=sdk-cli;",
        },
        {"type": "text", "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK."},
        {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}},
    ]


def test_a_new_claude_code_conversation_reuses_the_instructions_the_one_before_computed(
    claude: anthropic.Anthropic,
) -> None:
    instructions = SYSTEM_PROMPT + " Every answer cites the keeper's log (billing line test)."
    asked: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 4, "extra_body": NEVER_ENDS}
    first = claude.messages.create(
        **asked, system=claude_code_system("7a9", text=instructions), messages=[{"role": "user", "content": QUESTION}]
    )
    second = claude.messages.create(
        **asked,
        system=claude_code_system("430", text=instructions),
        messages=[{"role": "user", "content": "Which lighthouse is the tallest?"}],
    )
    # Nothing before shares these instructions (but the template's first tokens).
    assert (first.usage.cache_read_input_tokens or 0) < 0.1 * prompt_of(first.usage)
    assert second.usage.cache_read_input_tokens is not None
    # Everything up to the question (but the grid's last partial batch, on a model computed on one).
    assert second.usage.cache_read_input_tokens >= 0.75 * prompt_of(second.usage)


def test_the_billing_line_is_left_out_of_the_system_prompt_unless_kept() -> None:
    def body_with(system: Any) -> fields.MessagesBody:
        return fields.MessagesBody.model_validate(
            {"model": "m", "max_tokens": 4, "system": system, "messages": [{"role": "user", "content": QUESTION}]}
        )

    body = body_with(claude_code_system("7a9"))
    dropped = fields.system_prompt(body)
    assert "x-anthropic-billing-header" not in dropped
    assert dropped.startswith("You are a Claude agent")
    assert fields.system_prompt(body, as_sent=True).startswith("x-anthropic-billing-header: cc_version")
    as_text = body_with("x-anthropic-billing-header: cc_version=1.2.3.abc;\nBe brief.")
    assert fields.system_prompt(as_text) == "Be brief."
    only_billing = body_with([{**claude_code_system("7a9")[0], "cache_control": {"type": "ephemeral"}}])
    assert fields.system_prompt(only_billing) == ""
    assert (
        fields.keep_hints(only_billing, *fields.converted(only_billing)) == ()
    )  # no system message left for a breakpoint to keep


def test_system_messages_before_the_first_answer_are_told_with_the_system_prompt_unless_as_sent() -> None:
    agents = "Available agent types for the Agent tool:\n- claude: any task"
    later = "The user switched folders."
    body = fields.MessagesBody.model_validate(
        {
            "model": "m",
            "max_tokens": 4,
            "system": claude_code_system("7a9"),
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": QUESTION, "cache_control": {"type": "ephemeral"}}],
                },
                {"role": "system", "content": agents},
                {"role": "assistant", "content": "Ask on."},
                {"role": "system", "content": later},
                {"role": "user", "content": "Which lighthouse is the tallest?"},
            ],
        }
    )
    chat, ends = fields.converted(body)
    assert [message.role for message in chat] == [Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.SYSTEM, Role.USER]
    assert chat[0].content.startswith("You are a Claude agent")
    assert chat[0].content.endswith("\n\n" + agents)
    assert (chat[1].content, chat[3].content) == (QUESTION, later)  # a system message after an answer stays
    assert ends == [2, 1, 3, 4, 5]  # the opening system message is made with the system prompt
    assert [hint.messages for hint in fields.keep_hints(body, chat, ends)] == [
        1,
        2,
    ]  # the instructions' block, the question
    as_sent, sent_ends = fields.converted(body, as_sent=True)
    assert [message.role for message in as_sent][:3] == [Role.SYSTEM, Role.USER, Role.SYSTEM]
    assert as_sent[0].content.startswith("x-anthropic-billing-header")
    assert agents not in as_sent[0].content
    assert sent_ends == [2, 3, 4, 5, 6]
