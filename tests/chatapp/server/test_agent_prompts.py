"""Coding agents' first requests as their CLIs send them (captured from each CLI by a server that saves the
bodies, machine paths replaced): a new conversation's prompt begins with the instructions and tool schemas the
conversation before it computed, so the cache reuses them. Built as the server's routes build prompts, on the
bundled model's tokenizer; nothing is computed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from chatapp.engine.engine import Engine
from chatapp.engine.requests import SamplingParams
from chatapp.server import anthropic_fields, responses_fields
from chatapp.server.openai_api import chat_messages
from chatapp.server.reasoning_fields import anthropic_thinking, openai_reasoning, responses_reasoning
from chatapp.server.schemas import ChatCompletionBody
from chatapp.server.tool_fields import openai_shape
from chatapp.services.completions import CompletionRequest, CompletionService
from chatapp.store.answer_ids import AnswerIdStore

FIXTURES = Path(__file__).parent / "fixtures"


def messages_request(sent: dict[str, Any], as_sent: bool = False) -> CompletionRequest:
    """POST /v1/messages (anthropic_api.messages)."""
    body = anthropic_fields.MessagesBody.model_validate(sent)
    chat, _ = anthropic_fields.converted(body, as_sent)
    fields = body.fields_sent()
    return CompletionRequest(
        SamplingParams(),
        messages=tuple(chat),
        shape=anthropic_fields.anthropic_shape(fields),
        reasoning=anthropic_thinking(fields.get("thinking")),
    )


def chat_request(sent: dict[str, Any]) -> CompletionRequest:
    """POST /v1/chat/completions (openai_api.chat_completions)."""
    body = ChatCompletionBody.model_validate(sent)
    fields = body.fields_sent()
    return CompletionRequest(
        SamplingParams(),
        messages=tuple(chat_messages(body)),
        shape=openai_shape(fields),
        reasoning=openai_reasoning(fields.get("reasoning_effort")),
    )


def responses_request(sent: dict[str, Any]) -> CompletionRequest:
    """POST /v1/responses (responses_api.responses)."""
    body = responses_fields.ResponsesBody.model_validate(sent)
    fields = body.fields_sent()
    return CompletionRequest(
        SamplingParams(),
        messages=tuple(responses_fields.api_messages(body)),
        shape=responses_fields.responses_shape(fields),
        reasoning=responses_reasoning(fields.get("reasoning")),
    )


# Each agent as a new user runs it (versions in the names), two new conversations in an empty project:
# "What does this folder hold?", then "Which file should I read first?".
AGENTS: dict[str, tuple[str, Callable[[dict[str, Any]], CompletionRequest]]] = {
    "claude-code": ("claude_code_2.1.197", messages_request),  # claude -p --model opus "..."
    "codex": ("codex_0.171.0", responses_request),  # codex exec --skip-git-repo-check "..."
    "opencode": ("opencode_1.18.33", chat_request),  # opencode run -m local/gemma "..."
    "qwen-code": ("qwen_code_0.15.10", chat_request),  # qwen --auth-type openai -m gemma "..."
    "aider": ("aider_0.86.2", chat_request),  # aider --model openai/gemma --message "..." in a git repo
}


def captured(agent: str, conversation: str) -> dict[str, Any]:
    name = AGENTS[agent][0]
    body: dict[str, Any] = json.loads((FIXTURES / f"{name}_{conversation}_conversation.json").read_text("utf-8"))
    return body


def shared(first: tuple[int, ...], second: tuple[int, ...]) -> int:
    return next((index for index, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), len(second))


@pytest.fixture(scope="module")
def service(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> CompletionService:
    return CompletionService(engine, "agent", AnswerIdStore(tmp_path_factory.mktemp("answers")))


def prompts(service: CompletionService, agent: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    build = AGENTS[agent][1]
    first, second = (service.prompt_tokens(build(captured(agent, which))) for which in ("first", "second"))
    return first, second


@pytest.mark.parametrize(
    ("agent", "least"), [("claude-code", 18_000), ("codex", 6_000), ("opencode", 7_000), ("qwen-code", 14_000)]
)
def test_a_new_conversation_computes_only_its_question(service: CompletionService, agent: str, least: int) -> None:
    first, second = prompts(service, agent)
    assert len(second) > least  # the agent's instructions and tool schemas, as the server writes them
    # All but the question and the template's text after it (Claude Code's agent types are told with the system
    # prompt; every API's tools are written before the messages).
    assert len(second) - shared(first, second) < 64


def test_aider_repeats_all_but_its_question_and_the_rules_it_appends_to_it(
    service: CompletionService, engine: Engine
) -> None:
    """aider sends its edit format's rules (~200 tokens) in the same message as the question, after it: a new
    conversation computes them again, while its instructions, examples and repository map are reused."""
    first, second = prompts(service, "aider")
    reminder = captured("aider", "second")["messages"][-1]["content"].partition("\n\n")[2]
    assert "file listing" in reminder
    rules = len(engine.tokenize(reminder))
    assert shared(first, second) >= 0.6 * len(second)
    assert len(second) - shared(first, second) < rules + 64


def test_claude_codes_billing_line_as_sent_parts_conversations_at_once(service: CompletionService) -> None:
    """Sent as it comes (`--prompts-as-sent`), the billing line parts two conversations at its ~10th token."""
    as_sent = [
        service.prompt_tokens(messages_request(captured("claude-code", which), as_sent=True))
        for which in ("first", "second")
    ]
    assert shared(*as_sent) < 64
