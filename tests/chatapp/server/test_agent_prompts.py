"""Coding agents' first requests as their CLIs send them (captured from the CLI, machine paths replaced): a new
conversation's prompt begins with the instructions the conversation before it computed, so the cache reuses
them. Built as the server builds prompts, on the bundled model's tokenizer; nothing is computed."""

from __future__ import annotations

import json
from pathlib import Path

from chatapp.engine.engine import Engine
from chatapp.engine.requests import SamplingParams
from chatapp.server import anthropic_fields as fields
from chatapp.server.reasoning_fields import anthropic_thinking
from chatapp.services.completions import CompletionRequest, CompletionService
from chatapp.store.answer_ids import AnswerIdStore

FIXTURES = Path(__file__).parent / "fixtures"
# Claude Code 2.1.197 (`claude -p --model opus "..."` in an empty folder), two new conversations.
CLAUDE_CODE = ("claude_code_2.1.197_first_conversation.json", "claude_code_2.1.197_second_conversation.json")


def messages_prompt(service: CompletionService, fixture: str, as_sent: bool = False) -> tuple[int, ...]:
    body = fields.MessagesBody.model_validate(json.loads((FIXTURES / fixture).read_text(encoding="utf-8")))
    chat, _ = fields.converted(body, as_sent)
    sent = body.fields_sent()
    request = CompletionRequest(
        SamplingParams(),
        messages=tuple(chat),
        shape=fields.anthropic_shape(sent),
        reasoning=anthropic_thinking(sent.get("thinking")),
    )
    return service.prompt_tokens(request)


def shared(first: tuple[int, ...], second: tuple[int, ...]) -> int:
    return next((index for index, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), len(second))


def test_a_new_claude_code_conversation_shares_its_instructions_with_the_one_before(
    engine: Engine, tmp_path: Path
) -> None:
    service = CompletionService(engine, "claude-opus", AnswerIdStore(tmp_path / "answers"))
    first, second = (messages_prompt(service, fixture) for fixture in CLAUDE_CODE)
    assert len(second) > 15_000  # instructions and 24 tool schemas
    # All but the question: the agent types Claude Code sends after it are told with the system prompt.
    assert len(second) - shared(first, second) < 64
    # Sent as it comes, the billing line parts the two at its ~10th token.
    as_sent = [messages_prompt(service, fixture, as_sent=True) for fixture in CLAUDE_CODE]
    assert shared(*as_sent) < 64
