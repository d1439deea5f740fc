"""K's and J's requests as Claude Code sends them (Anthropic's Messages API), and the streamed answer read back.

A request is the whole session so far: the system prompt and the tools, the user's task, then per
turn the agent's tool call (a `tool_use` block) and its result (a `tool_result` block), with
`cache_control` on the system prompt and on the newest block, as Claude Code marks them. The model
may answer with text or a call (`tool_choice` auto, as Claude Code asks); the answer read back
writes a call as `[tool_use NAME]` and its input, so it can be compared with the same prompt
computed cold (`answer_as_shown`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from chatapp.benchmark.peers import PeerAnswer
from chatapp.benchmark.workloads import Request
from chatapp.prompting.prompt import ChatMessage, PromptBuilder
from chatapp.services.answer_shape import AnswerShape, read_answer
from chatapp.services.streamed_answer import CallArguments, CallBegins, Shown, StreamedContent
from chatapp.tools import arguments_json
from chatapp.vocabulary import Role

MESSAGES_PATH = "/v1/messages"
EPHEMERAL = {"type": "ephemeral"}


def anthropic_body(request: Request, max_tokens: int) -> dict[str, Any]:
    """The Messages API body for `request`'s messages and tools."""
    history = list(request.messages)
    system = history.pop(0).content if history and history[0].role is Role.SYSTEM else ""
    messages = [_message(message) for message in history]
    if messages:
        messages[-1]["content"][-1]["cache_control"] = EPHEMERAL
    if request.after_question:  # J: sent after the first question, as Claude Code sends its agent types
        system = system.removesuffix("\n\n" + request.after_question)
        messages.insert(1, {"role": "system", "content": request.after_question})
    billing = [{"type": "text", "text": request.billing_line}] if request.billing_line else []
    tools = [
        {"name": spec.name, "description": spec.description, "input_schema": spec.parameters} for spec in request.tools
    ]
    return {
        "model": "claude-sonnet-4-5",
        "system": [*billing, {"type": "text", "text": system, "cache_control": EPHEMERAL}],
        "messages": messages,
        "tools": tools,
        "tool_choice": {"type": "auto"},
        "max_tokens": int(max_tokens),
        "temperature": 0,
        "top_k": 1,
        "stream": True,
    }


def _message(message: ChatMessage) -> dict[str, Any]:
    if message.role is Role.TOOL:
        results = [
            {"type": "tool_result", "tool_use_id": result.call_id, "content": result.content}
            for result in message.results
        ]
        return {"role": "user", "content": results}
    blocks: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
    blocks += [
        {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments} for call in message.tool_calls
    ]
    return {"role": "assistant" if message.role is Role.ASSISTANT else "user", "content": blocks}


def call_marker(name: str) -> str:
    """How a read-back answer writes the start of a call (its input follows)."""
    return f"[tool_use {name}]"


def answer_as_shown(text: str, shape: AnswerShape, builder: PromptBuilder) -> str:
    """An answer computed whole (cold), written as `read_anthropic_stream` reads the server's stream of it:
    its text, then each call it began (cut ones too) with its input."""
    stream = StreamedContent(shape, builder)
    items: list[Shown] = [stream.feed(text), *stream.calls()]
    whole = read_answer(text, shape, builder)
    items += [stream.rest(whole), *stream.ending(whole)]
    written: list[str] = []
    call_input: list[str] = []
    for item in items:
        if isinstance(item, str):
            written.append(item)
        elif isinstance(item, CallBegins):
            written.append(call_marker(item.name))
            call_input = []
        elif isinstance(item, CallArguments):
            call_input.append(item.text)
        else:
            written.append(_canonical_input("".join(call_input)))
    return "".join(written)


def read_anthropic_stream(events: Iterable[tuple[float, dict[str, Any]]]) -> PeerAnswer:
    """The answer from Anthropic's streamed events: the text, the first text's time, and usage (the prompt
    as input + cache creation + cache read; computed: all but what was read). A call's input, streamed in
    pieces as the model writes it, is read back as canonical JSON (as `answer_as_shown` writes it)."""
    texts: list[str] = []
    call_input: list[str] | None = None  # the pieces of the call being read
    ttft_s: float | None = None
    usage: dict[str, Any] = {}
    elapsed = 0.0
    for elapsed, event in events:
        kind = event.get("type")
        if kind == "message_start":
            usage.update(event.get("message", {}).get("usage") or {})
        elif kind == "content_block_start" and (event.get("content_block") or {}).get("type") == "tool_use":
            ttft_s = elapsed if ttft_s is None else ttft_s
            texts.append(call_marker(event["content_block"].get("name", "")))
            call_input = []
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            text = delta.get("text") or delta.get("partial_json") or ""
            if text and ttft_s is None:
                ttft_s = elapsed
            (texts if call_input is None else call_input).append(text)
        elif kind == "content_block_stop" and call_input is not None:
            texts.append(_canonical_input("".join(call_input)))
            call_input = None
        elif kind == "message_delta":
            usage.update({key: value for key, value in (event.get("usage") or {}).items() if value is not None})
    if call_input is not None:  # the stream ended inside a call
        texts.append("".join(call_input))
    read = int(usage.get("cache_read_input_tokens") or 0)
    prompt = int(usage.get("input_tokens") or 0) + int(usage.get("cache_creation_input_tokens") or 0) + read
    total_ms = elapsed * 1000
    return PeerAnswer(
        text="".join(texts),
        token_ids=None,
        ttft_ms=ttft_s * 1000 if ttft_s is not None else total_ms,
        total_ms=total_ms,
        prompt_tokens=prompt,
        computed_tokens=prompt - read,
        answer_tokens=int(usage.get("output_tokens") or 0),
    )


def _canonical_input(written: str) -> str:
    """A call's input as canonical JSON (the text as it came where it is not JSON: a cut call)."""
    try:
        return arguments_json(json.loads(written))
    except json.JSONDecodeError:
        return written
