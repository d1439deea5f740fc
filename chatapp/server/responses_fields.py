"""OpenAI's Responses API read into the app's terms, and answers written back as its output items.

A translation at the edge only, as for Anthropic's API: `instructions` and the input items become
the same `ApiMessage`s as a chat completion's messages, the flat function tools and `text.format`
the same `AnswerShape` (read by tool_fields.openai_shape from their chat-completion spelling), so
every route rides one answer pipeline. The server is stateless: it keeps no response by id.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any

from pydantic import Field

from chatapp.server.errors import ApiError
from chatapp.server.schemas import SEED_LIMIT, Lenient, role_of
from chatapp.server.tool_fields import openai_shape, request_arguments
from chatapp.services.answer_shape import AnswerShape
from chatapp.services.completions import ApiMessage, CompletionOutcome
from chatapp.tools import ToolCall
from chatapp.vocabulary import Role, StopReason

TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
DROPPED_ITEMS = frozenset({"reasoning"})  # passed back by clients; the prompt does not show them
STATELESS = (
    "previous_response_id: this server keeps no responses (it is stateless); send the whole conversation as input"
)


class ResponsesBody(Lenient):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT)
    stream: bool = False
    ignore_eos: bool | None = None  # as on the chat route
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None


def api_messages(body: ResponsesBody) -> list[ApiMessage]:
    """`instructions` as the system prompt, then each input item: function calls join the assistant turn
    before them, their outputs become tool messages."""
    if body.previous_response_id:
        raise ApiError(400, STATELESS, param="previous_response_id")
    if body.conversation is not None:
        raise ApiError(400, STATELESS.replace("previous_response_id", "conversation", 1), param="conversation")
    if body.background:
        raise ApiError(
            400,
            "background: this server answers within the request (it keeps no responses to poll); "
            "send it without background, with stream if you want the text as it comes",
            param="background",
        )
    messages: list[ApiMessage] = [ApiMessage(Role.SYSTEM, body.instructions)] if body.instructions else []
    if isinstance(body.input, str):
        return [*messages, ApiMessage(Role.USER, body.input)]
    names: dict[str, str] = {}  # call id -> function name, for the outputs
    for index, item in enumerate(body.input):
        where = f"input[{index}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            role = role_of(str(item.get("role")), index)
            messages.append(ApiMessage(role, _content_text(item.get("content"), f"{where}.content")))
        elif kind == "function_call":
            call = _call(item, where)
            names[call.id] = call.name
            messages.append(_with_call(messages, call))
        elif kind == "function_call_output":
            call_id = str(item.get("call_id") or "")
            if not call_id:
                raise ApiError(400, f"{where}.call_id is missing; name the call this output answers", param=where)
            output = _content_text(item.get("output"), f"{where}.output")
            messages.append(
                ApiMessage(Role.TOOL, output, tool_call_id=call_id, name=names.get(call_id, ""), where=where)
            )
        elif not isinstance(kind, str) or kind not in DROPPED_ITEMS:
            raise ApiError(
                400,
                f"{where} is of type {kind!r}; this server reads message, function_call and function_call_output",
                param=where,
            )
    return messages


def _with_call(messages: list[ApiMessage], call: ToolCall) -> ApiMessage:
    """The assistant turn that makes `call`: the one just before (taken off the list), or a new one."""
    if messages and messages[-1].role is Role.ASSISTANT:
        turn = messages.pop()
        return replace(turn, tool_calls=(*turn.tool_calls, call))
    return ApiMessage(Role.ASSISTANT, "", tool_calls=(call,))


def _call(item: dict[str, Any], where: str) -> ToolCall:
    name, call_id = item.get("name"), item.get("call_id")
    if not isinstance(name, str) or not name or not isinstance(call_id, str) or not call_id:
        raise ApiError(400, f"{where} needs the call's call_id and name", param=where)
    return ToolCall(call_id, name, request_arguments(item.get("arguments") or "{}", f"{where}.arguments"))


def _content_text(content: Any, where: str) -> str:
    """A string, or text parts joined (input_text, output_text); an image or a file is a 400."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ApiError(400, f"{where} must be text or a list of text parts", param=where)
    pieces = []
    for number, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str) or kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise ApiError(400, f"{where}[{number}] is of type {kind!r}; this server reads text only", param=where)
        pieces.append(part["text"])
    return "".join(pieces)


def responses_shape(fields: dict[str, Any]) -> AnswerShape:
    """Flat function tools, `tool_choice`, `parallel_tool_calls` and `text.format`, read as a chat request's."""
    tools = fields.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ApiError(400, "tools must be a list of function tools", param="tools")
    nested = []
    for index, tool in enumerate(tools or ()):
        if not isinstance(tool, dict):
            raise ApiError(400, f"tools[{index}] must be an object such as a function tool", param="tools")
        if tool.get("type") != "function":
            continue  # a hosted tool (web search) or a namespace of a client's sub-agents: never offered
        function = {key: tool[key] for key in ("name", "description", "parameters") if key in tool}
        nested.append({"type": "function", "function": function})
    choice = fields.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    chat_fields: dict[str, Any] = {"tools": nested or None, "tool_choice": choice}
    if "parallel_tool_calls" in fields:
        chat_fields["parallel_tool_calls"] = fields["parallel_tool_calls"]
    text = fields.get("text")
    form = text.get("format") if isinstance(text, dict) else None
    if isinstance(form, dict) and form.get("type") == "json_schema":
        described = {key: form[key] for key in ("name", "schema", "strict") if key in form}
        chat_fields["response_format"] = {"type": "json_schema", "json_schema": described}
    elif form is not None:
        chat_fields["response_format"] = form
    return openai_shape(chat_fields)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def output_items(outcome: CompletionOutcome, message_id: str) -> list[dict[str, Any]]:
    """The answer's text as a message item (if any), then each call as a function_call item."""
    items = [message_item(message_id, outcome.text)] if outcome.text else []
    return items + [call_item(call) for call in outcome.tool_calls]


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [text_part(text)] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def call_item(call: ToolCall, status: str = "completed") -> dict[str, Any]:
    arguments = call.arguments_json if status == "completed" else ""
    return {
        "type": "function_call",
        "id": f"fc_{call.id}",
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
        "status": status,
    }


def usage(outcome: CompletionOutcome) -> dict[str, Any]:
    """`input_tokens` counts the cached ones too (`input_tokens_details.cached_tokens`), as OpenAI counts."""
    figures = outcome.usage
    return {
        "input_tokens": figures.prompt_tokens,
        "input_tokens_details": {"cached_tokens": figures.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": figures.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": figures.prompt_tokens + figures.completion_tokens,
    }


def response(
    response_id: str, body: ResponsesBody, fields: dict[str, Any], outcome: CompletionOutcome | None, output: list[Any]
) -> dict[str, Any]:
    """The response object: in progress (no outcome yet) or ended, with what the request asked for echoed."""
    cut = outcome is not None and outcome.stop_reason in (StopReason.LENGTH, StopReason.CONTEXT)
    status = "in_progress" if outcome is None else "incomplete" if cut else "completed"
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": body.model,
        "output": output,
        "parallel_tool_calls": bool(fields.get("parallel_tool_calls")),  # one call per answer unless asked
        "previous_response_id": None,
        "reasoning": {"effort": _asked_effort(fields), "summary": None},
        "store": False,
        "temperature": body.temperature,
        "text": fields.get("text") or {"format": {"type": "text"}},
        "tool_choice": fields.get("tool_choice") or "auto",
        "tools": fields.get("tools") or [],
        "top_p": body.top_p,
        "truncation": "disabled",
        "usage": usage(outcome) if outcome is not None else None,
        "metadata": fields.get("metadata") or {},
    }


def _asked_effort(fields: dict[str, Any]) -> str | None:
    """The reasoning effort the request set (passed to the model's template where it has a switch)."""
    reasoning = fields.get("reasoning")
    return reasoning.get("effort") if isinstance(reasoning, dict) else None
