"""Workload F, the agent loop: real tools in every request, tool calls and their results in the history.

Built on the tiny model's vocabulary with two templates: the bundled one, which has no tools
(the format is taught in the system prompt), and a Qwen3-style one that renders them itself.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatapp.benchmark.agent_tools import TOOL_SET
from chatapp.benchmark.anthropic_client import anthropic_body
from chatapp.benchmark.workloads import SCALES, Request, Workload, build_workloads
from chatapp.engine.handle import GenerationHandle
from chatapp.engine.llama_native import NativeModel
from chatapp.engine.opening import open_prompt_builder
from chatapp.engine.requests import GenerationRequest
from chatapp.prompting.prompt import ChatMessage
from chatapp.server import anthropic_fields
from chatapp.tools import ToolSpec
from chatapp.vocabulary import Role
from tests.chatapp.benchmark.test_agent_tools import TYPES, follows
from tests.model_factory import write_tiny_llama

TEMPLATES = Path(__file__).parents[1] / "prompting" / "templates"
SCALE = SCALES["tiny"]


@pytest.fixture(scope="module", params=["taught", "native"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled template (tools taught in the system prompt) or a Qwen3-style one (its own tools block)."""
    template = None if request.param == "taught" else (TEMPLATES / "qwen3_style.jinja").read_text()
    return write_tiny_llama(tmp_path_factory.mktemp(request.param) / "tiny.gguf", chat_template=template)


@pytest.fixture(scope="module")
def agent_loop(model: Path) -> Workload:
    (workload,) = build_workloads(model, SCALE, ("F",))
    return workload


@pytest.fixture(scope="module")
def vocabulary(model: Path) -> Iterator[NativeModel]:
    opened = NativeModel(model, vocab_only=True)
    yield opened
    opened.close()


def text_of(vocabulary: NativeModel, tokens: tuple[int, ...]) -> str:
    return vocabulary.detokenize(list(tokens), special=True)


def by_client(workload: Workload) -> list[list[Request]]:
    return [
        [request for request in workload.requests if request.client == client] for client in range(workload.clients)
    ]


def test_every_request_sends_the_coding_agents_tools(agent_loop: Workload, vocabulary: NativeModel) -> None:
    tools = agent_loop.requests[0].tools
    assert [tool.name for tool in tools] == [name for name, _, _ in TOOL_SET]
    assert 8 <= len(tools) <= 12
    for tool in tools:
        schema = tool.parameters
        assert schema["type"] == "object"
        assert set(schema["required"]) <= set(schema["properties"])
        assert all(item["type"] in TYPES for item in schema["properties"].values())
    for request in agent_loop.requests:
        assert request.tools == tools
        prompt = text_of(vocabulary, request.tokens)
        # As chat templates print them (json.dumps, as Hugging Face's tojson): the whole schema, every time.
        for tool in tools:
            assert json.dumps(tool.template_input(), ensure_ascii=False) in prompt, (request.label, tool.name)


def test_each_history_is_a_task_then_tool_calls_and_their_results(
    agent_loop: Workload, vocabulary: NativeModel
) -> None:
    specs = {tool.name: tool for tool in agent_loop.requests[0].tools}
    for requests in by_client(agent_loop):
        assert len(requests) == SCALE.agent_turns
        for step, request in enumerate(requests):
            system, task, *history = request.messages
            assert system.role is Role.SYSTEM
            assert task.role is Role.USER
            assert task.content.startswith("Task T-")
            assert [message.role for message in history] == [Role.ASSISTANT, Role.TOOL] * step
            prompt = text_of(vocabulary, request.tokens)
            assert prompt.endswith("<|im_start|>assistant\n")
            for calling, answered in zip(history[::2], history[1::2], strict=True):
                check_call(calling, answered, specs, prompt)


def check_call(calling: ChatMessage, answered: ChatMessage, specs: dict[str, ToolSpec], prompt: str) -> None:
    """An assistant message of one call with arguments that follow its tool's schema, then that call's result."""
    (call,) = calling.tool_calls
    assert calling.content == ""
    assert call.id
    assert follows(call.arguments, specs[call.name].parameters), call
    (result,) = answered.results
    assert (result.call_id, result.name) == (call.id, call.name)
    assert result.content.strip()
    written = json.dumps(call.arguments, ensure_ascii=False)
    assert f'<tool_call>\n{{"name": "{call.name}", "arguments": {written}}}\n</tool_call>' in prompt
    assert f"<tool_response>\n{result.content}\n</tool_response>" in prompt


def test_a_clients_prompts_only_grow_and_every_client_shares_the_tools(
    agent_loop: Workload, vocabulary: NativeModel
) -> None:
    clients = by_client(agent_loop)
    for requests in clients:
        for earlier, later in itertools.pairwise(requests):
            assert later.tokens[: len(earlier.tokens)] == earlier.tokens  # the agent's history, kept whole
            assert later.known_prefix == len(earlier.tokens)
    firsts = [requests[0] for requests in clients]
    shared = min(request.known_prefix for request in firsts[1:])
    assert "</tools>" in text_of(vocabulary, firsts[0].tokens[:shared])


def test_the_tokens_are_the_apps_prompt_for_those_messages_and_tools(agent_loop: Workload, model: Path) -> None:
    """What every peer is sent is what the app builds for a request with these messages and tools."""
    builder = open_prompt_builder(model)
    try:
        for request in agent_loop.requests:
            assert tuple(builder.with_tools(request.tools).build(list(request.messages))) == request.tokens
    finally:
        builder.close()


def test_the_peer_restarts_half_way_in_a_context_that_holds_every_prompt(agent_loop: Workload) -> None:
    assert agent_loop.clients == SCALE.agent_clients
    assert agent_loop.restart_before == SCALE.agent_clients * (SCALE.agent_turns // 2)
    after = [request.label.startswith("after restart: ") for request in agent_loop.requests]
    assert after == [index >= agent_loop.restart_before for index in range(len(after))]
    assert max(len(request.tokens) for request in agent_loop.requests) + SCALE.max_tokens < agent_loop.context


@pytest.mark.parametrize("scale", ["quick", "full"])
def test_an_ideal_cache_reuses_95_percent_of_each_clients_later_requests(model: Path, scale: str) -> None:
    """The goal's threshold is within reach: a step adds its call and result, a few percent of the prompt."""
    (workload,) = build_workloads(model, SCALES[scale], ("F",))
    clients = by_client(workload)
    shared = min(requests[0].known_prefix for requests in clients[1:])  # the system prompt and the tools
    assert shared >= 0.95 * SCALES[scale].agent_system
    for requests in clients:
        assert all(request.known_prefix >= 0.95 * len(request.tokens) for request in requests[1:])


def openai_messages(messages: tuple[ChatMessage, ...]) -> list[dict[str, Any]]:
    """The messages as an OpenAI client sends them: calls with arguments as JSON text, results as tool messages."""
    sent: list[dict[str, Any]] = []
    for message in messages:
        if message.role is Role.TOOL:
            sent += [
                {"role": "tool", "tool_call_id": result.call_id, "content": result.content}
                for result in message.results
            ]
        elif message.tool_calls:
            calls = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                }
                for call in message.tool_calls
            ]
            sent.append({"role": "assistant", "content": None, "tool_calls": calls})
        else:
            sent.append({"role": message.role.value, "content": message.content})
    return sent


@pytest.mark.slow
def test_a_client_sending_the_chat_with_its_tools_gets_the_same_prompt(
    agent_loop: Workload, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`chatapp serve`, sent each request as an agent sends it (tools, calls, tool messages), computes its tokens."""
    import openai

    from tests.server_support import running_server

    with running_server(tmp_path, model, context_cap=agent_loop.context, sequences=2) as server:
        prompts: list[tuple[int, ...]] = []
        generate = server.engine.generate

        def recording(request: GenerationRequest) -> GenerationHandle:
            prompts.append(tuple(request.prompt_tokens))
            return generate(request)

        monkeypatch.setattr(server.engine, "generate", recording)
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300) as client:
            for request in agent_loop.requests:
                client.chat.completions.create(
                    model=server.model_id,
                    messages=openai_messages(request.messages),
                    tools=[tool.template_input() for tool in request.tools],
                    max_tokens=1,
                    temperature=0,
                )
    assert prompts == [request.tokens for request in agent_loop.requests]


@pytest.fixture(scope="module")
def new_conversations(model: Path) -> Workload:
    (workload,) = build_workloads(model, SCALE, ("J",))
    return workload


def test_new_conversations_are_sent_as_claude_code_begins_them(new_conversations: Workload) -> None:
    """Each conversation's body: a billing line of its own first, the instructions, the question, then the agent
    types as a system message; the sub-agent's request has instructions of its own."""
    labels = [request.label for request in new_conversations.requests]
    assert labels == ["conversation 1", "sub-agent", "conversation 2"]
    bodies = [anthropic_body(request, 4) for request in new_conversations.requests]
    billing = [body["system"][0]["text"] for body in bodies]
    assert all(line.startswith("x-anthropic-billing-header: cc_version=") for line in billing)
    assert len(set(billing)) == len(billing)
    first, sub_agent, second = bodies
    assert first["system"][1] == second["system"][1]
    assert [message["role"] for message in second["messages"]] == ["user", "system"]
    assert second["messages"][1]["content"].startswith("Available agent types")
    assert second["messages"][0]["content"] != first["messages"][0]["content"]
    assert [message["role"] for message in sub_agent["messages"]] == ["user"]
    assert sub_agent["system"][1]["text"] != first["system"][1]["text"]
    assert new_conversations.cold_checked == (2,)  # the first conversation that reuses is the last here


def test_chatapp_reads_each_body_back_to_the_workloads_prompt(new_conversations: Workload, model: Path) -> None:
    """The server leaves the billing line out and tells the agent types with the system prompt: the messages
    it builds the prompt from are the workload's, so the prompt is the workload's tokens."""
    builder = open_prompt_builder(model)
    for request in new_conversations.requests:
        body = anthropic_fields.MessagesBody.model_validate(anthropic_body(request, 4))
        chat, _ = anthropic_fields.converted(body)
        assert [(message.role, message.content) for message in chat] == [
            (message.role, message.content) for message in request.messages
        ]
        assert tuple(builder.with_tools(request.tools).build(list(request.messages))) == request.tokens
    conversations = [request.tokens for request in new_conversations.requests if request.label != "sub-agent"]
    question = len(conversations[1]) - new_conversations.requests[2].known_prefix
    assert question < 0.5 * len(conversations[1])  # all but the question was known from the first
