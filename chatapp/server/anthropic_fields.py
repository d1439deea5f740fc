"""Anthropic's Messages API read into the app's terms, and the app's answers written back in its shape.

A translation at the edge only: the messages become the same `ApiMessage`s, the tools the same
`AnswerShape`, as a `/v1/chat/completions` request's, so both ride one answer pipeline (the
same prompts, grammars and remembered answer ids). Content blocks the server cannot read
(images, documents) are a 400 naming the block; thinking blocks passed back are dropped, as
the templates of models without visible reasoning drop them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import Field

from chatapp.server.errors import ApiError
from chatapp.server.schemas import SEED_LIMIT, Lenient, checked_stop
from chatapp.server.tool_fields import openai_shape
from chatapp.services.answer_shape import AnswerShape, ShapeError, schema_shape
from chatapp.services.completions import ApiMessage, CompletionOutcome, CompletionUsage, KeepHint
from chatapp.tools import ToolCall, arguments_json
from chatapp.vocabulary import Role, StopReason

# Blocks an assistant turn may carry back that say nothing the prompt shows.
DROPPED_BLOCKS = frozenset({"thinking", "redacted_thinking"})
# Anthropic's tool_choice types in the chat API's words ("tool" names its function).
CHAT_TOOL_CHOICES = {"auto": "auto", "any": "required", "tool": "function", "none": "none"}
CACHE_TTLS = {"5m": 300.0, "1h": 3600.0}  # cache_control's times to live, in seconds
MAX_BREAKPOINTS = 4  # Anthropic's limit on blocks with cache_control


class AnthropicBlock(Lenient):
    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: str | list[AnthropicBlock] | None = None
    is_error: bool | None = None
    cache_control: Any = None


class AnthropicMessage(Lenient):
    role: str
    content: str | list[AnthropicBlock]


class MessagesBase(Lenient):
    """What both `/v1/messages` and `/v1/messages/count_tokens` read."""

    model: str
    messages: list[AnthropicMessage]
    system: str | list[AnthropicBlock] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None


class MessagesBody(MessagesBase):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT)  # not Anthropic's: kept for reproducible tests
    stream: bool = False
    ignore_eos: bool = False  # not Anthropic's: as on the OpenAI routes

    def stops(self) -> tuple[str, ...]:
        return checked_stop(self.stop_sequences, "stop_sequences")


# Claude Code's first system block: metadata for Anthropic's billing, not text for the model. Its last part
# follows the conversation's first message, so two conversations' prompts would part at its ~10th token,
# before the ~20k tokens of instructions and tool schemas that every one of them shares.
BILLING_LINE = "x-anthropic-billing-header:"


def system_prompt(body: MessagesBase, as_sent: bool = False) -> str:
    """The system prompt the model is told: the text or text blocks, Claude Code's billing line left out, and
    the system messages sent before the first answer (`opening_system_messages`) after it; `as_sent`: the
    system field alone, as it comes."""
    system = body.system
    if as_sent:
        return _text_of(system, "system")
    if isinstance(system, list):
        system = [block for block in system if not (block.text or "").lstrip().startswith(BILLING_LINE)]
    elif system is not None and system.lstrip().startswith(BILLING_LINE):
        system = system.lstrip().partition("\n")[2]
    opening = [
        _text_of(body.messages[index].content, f"messages[{index}].content") for index in opening_system_messages(body)
    ]
    return "\n\n".join(text for text in (_text_of(system, "system"), *opening) if text.strip())


def opening_system_messages(body: MessagesBase) -> list[int]:
    """The places of the system messages sent before the first answer. Claude Code sends one after each new
    conversation's first question (the ~1.5k tokens of "Available agent types", the same in every
    conversation, and in the same place in its later requests): told with the system prompt, before the
    question, every new conversation reuses it."""
    places = []
    for index, message in enumerate(body.messages):
        if message.role == "assistant":
            break
        if message.role == "system":
            places.append(index)
    return places


def api_messages(body: MessagesBase, as_sent: bool = False) -> list[ApiMessage]:
    """The system prompt, then each message: a user turn's tool results become tool messages, in order."""
    return converted(body, as_sent)[0]


def converted(body: MessagesBase, as_sent: bool = False) -> tuple[list[ApiMessage], list[int]]:
    """The request's messages, and after each of the client's how many of them are made; `as_sent`: Claude
    Code's billing line and opening system messages where they come (`system_prompt`)."""
    messages: list[ApiMessage] = []
    ends: list[int] = []
    system = system_prompt(body, as_sent)
    if system.strip():
        messages.append(ApiMessage(Role.SYSTEM, system))
    with_system = len(messages)
    told = set() if as_sent else set(opening_system_messages(body))
    for index, message in enumerate(body.messages):
        where = f"messages[{index}]"
        blocks = (
            [AnthropicBlock(type="text", text=message.content)] if isinstance(message.content, str) else message.content
        )
        if index in told:
            pass  # told with the system prompt
        elif message.role == "user":
            messages.extend(_user_turn(blocks, where))
        elif message.role == "assistant":
            messages.append(_assistant_turn(blocks, where))
        elif message.role == "system":  # Claude Code's mid-conversation system messages (a beta of 2026)
            messages.append(ApiMessage(Role.SYSTEM, _text_of(blocks, f"{where}.content")))
        else:
            raise ApiError(
                400, f"{where}.role is {message.role!r}; use user, assistant or system", param=f"{where}.role"
            )
        ends.append(with_system if index in told else len(messages))
    return messages, ends


def _text_of(content: str | list[AnthropicBlock] | None, where: str) -> str:
    """Text, or text blocks joined by newlines (a system prompt, a tool result); any other block is a 400."""
    if content is None or isinstance(content, str):
        return content or ""
    pieces = []
    for number, block in enumerate(content):
        if block.type != "text":
            raise ApiError(400, f"{where}[{number}] is of type {block.type!r}; send text blocks", param=where)
        pieces.append(block.text or "")
    return "\n".join(pieces)


def _turn_blocks(
    blocks: list[AnthropicBlock], where: str, kind: str, holds: str, dropped: frozenset[str] = frozenset()
) -> tuple[str, list[tuple[str, AnthropicBlock]]]:
    """A turn's text blocks joined, and its blocks of type `kind` with their places; a block of any other
    type (but `dropped`) is refused, `holds` saying what the turn may hold."""
    texts: list[str] = []
    found: list[tuple[str, AnthropicBlock]] = []
    for number, block in enumerate(blocks):
        place = f"{where}.content[{number}]"
        if block.type == "text":
            texts.append(block.text or "")
        elif block.type == kind:
            found.append((place, block))
        elif block.type not in dropped:
            raise ApiError(400, f"{place} is of type {block.type!r}; {holds}", param=place)
    return "\n".join(texts), found


def _user_turn(blocks: list[AnthropicBlock], where: str) -> list[ApiMessage]:
    text, found = _turn_blocks(blocks, where, "tool_result", "this server reads text and tool results")
    results: list[ApiMessage] = []
    for place, block in found:
        if not block.tool_use_id:
            raise ApiError(400, f"{place}.tool_use_id is missing; name the call it answers", param=place)
        result = _text_of(block.content, f"{place}.content")
        if block.is_error:  # the model must tell a failed tool from a result
            result = f"Error: {result}"
        results.append(ApiMessage(Role.TOOL, result, tool_call_id=block.tool_use_id, where=place))
    if not results and not text.strip():
        raise ApiError(400, f"{where}.content is empty; send some text", param=f"{where}.content")
    return [*results, *([ApiMessage(Role.USER, text)] if text.strip() else [])]


def _assistant_turn(blocks: list[AnthropicBlock], where: str) -> ApiMessage:
    holds = "an assistant turn holds text and tool_use"
    text, found = _turn_blocks(blocks, where, "tool_use", holds, DROPPED_BLOCKS)
    calls: list[ToolCall] = []
    for place, block in found:
        if not block.name or not block.id:
            raise ApiError(400, f"{place} needs the call's id and name", param=place)
        calls.append(ToolCall(block.id, block.name, arguments_json(block.input if block.input is not None else {})))
    return ApiMessage(Role.ASSISTANT, text, tool_calls=tuple(calls))


def anthropic_shape(fields: dict[str, Any]) -> AnswerShape:
    """`tools` (name, description, input_schema) and `tool_choice` of a Messages request, read as a chat request's
    (tool_fields.openai_shape: the same checks and the same shape)."""
    tools = fields.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ApiError(400, "tools must be a list of tools", param="tools")
    nested = []
    for index, tool in enumerate(tools or ()):
        kind = tool.get("type", "custom") if isinstance(tool, dict) else None
        if kind != "custom":
            where = f"tools[{index}]"
            raise ApiError(
                400, f"{where} is of type {kind!r}; only client tools (with input_schema) are served", param=where
            )
        function = {
            "name": tool.get("name"),
            "description": tool.get("description"),
            "parameters": tool.get("input_schema"),
        }
        nested.append({"type": "function", "function": function})
    chat_fields: dict[str, Any] = {"tools": nested or None}
    value = fields.get("tool_choice")
    if value is not None:
        kind = value.get("type") if isinstance(value, dict) else None
        if not isinstance(kind, str) or kind not in CHAT_TOOL_CHOICES:
            raise ApiError(400, "tool_choice.type must be 'auto', 'any', 'tool' or 'none'", param="tool_choice")
        name = value.get("name")
        chat_fields["tool_choice"] = (
            {"type": "function", "function": {"name": name}} if kind == "tool" else CHAT_TOOL_CHOICES[kind]
        )
        # One call per answer unless the client allows several (small models loop): llama-server's default too.
        chat_fields["parallel_tool_calls"] = value.get("disable_parallel_tool_use") is False
    shape = openai_shape(chat_fields)
    schema, param = _output_schema(fields)
    if schema is None:
        return shape
    try:
        formatted = schema_shape(schema, param)
    except ShapeError as error:
        raise ApiError(400, str(error), param=error.param) from None
    return replace(shape, json_schema=formatted.json_schema, schema_param=param)


def _output_schema(fields: dict[str, Any]) -> tuple[Any, str]:
    """The JSON schema the answer's text must follow (structured outputs: `output_config.format`, or the beta's
    `output_format`), and where it was sent; None when the answer is free."""
    config = fields.get("output_config")
    if config is not None and not isinstance(config, dict):
        raise ApiError(400, "output_config must be an object", param="output_config")
    form, where = (config or {}).get("format"), "output_config.format"
    if form is None:
        form, where = fields.get("output_format"), "output_format"
    if form is None:
        return None, where
    if not isinstance(form, dict) or form.get("type") != "json_schema":
        raise ApiError(400, f"{where} must be {{'type': 'json_schema', 'schema': {{...}}}}", param=where)
    if "schema" not in form:
        raise ApiError(400, f"{where}.schema is missing; send the schema", param=f"{where}.schema")
    return form["schema"], f"{where}.schema"


def stop_reason(outcome: CompletionOutcome) -> str:
    """Anthropic's `stop_reason`: tool_use when the answer made calls (and was not cut off), else how it ended."""
    cut = outcome.stop_reason in (StopReason.LENGTH, StopReason.CONTEXT)
    if outcome.tool_calls and not cut:
        return "tool_use"
    if cut:
        return "max_tokens"
    if outcome.stop_reason is StopReason.STOP_STRING:
        return "stop_sequence"
    return "end_turn"


def matched_stop(outcome: CompletionOutcome, stops: tuple[str, ...]) -> str | None:
    """The stop sequence that ended the answer (Anthropic names it): the only one when there is one."""
    if outcome.stop_reason is not StopReason.STOP_STRING or not stops:
        return None
    return stops[0] if len(stops) == 1 else None


def usage(prompt: int, reused: int, output_tokens: int = 0, kept: int = 0) -> dict[str, int]:
    """Anthropic's usage: `cache_read_input_tokens` reused from the cache, `cache_creation_input_tokens`
    computed now up to the last `cache_control` breakpoint (`kept`: the beginning pinned for the next
    request), `input_tokens` computed now after it. The three add up to the prompt, as Anthropic's do.
    (chatapp keeps every computed token's KV, breakpoint or not: a breakpoint only pins it.)"""
    created = max(0, min(kept, prompt) - reused)
    return {
        "input_tokens": prompt - reused - created,
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": reused,
        "output_tokens": output_tokens,
    }


def final_usage(figures: CompletionUsage) -> dict[str, int]:
    """The usage of an answer that ended."""
    return usage(figures.prompt_tokens, figures.cached_tokens, figures.completion_tokens, figures.kept_tokens)


def keep_hints(body: MessagesBase, chat: list[ApiMessage], ends: list[int]) -> tuple[KeepHint, ...]:
    """The request's `cache_control` breakpoints: each keeps the prompt through the message that holds it
    (tools and system: through the system prompt, which the tools are written into); `chat` and `ends`: what
    `converted` made, and how many messages it had made after each of the client's."""
    breakpoints: list[tuple[str, Any]] = []
    system_blocks = body.system if isinstance(body.system, list) else []
    breakpoints += [(f"tools[{index}]", tool.get("cache_control")) for index, tool in enumerate(body.tools or ())]
    breakpoints += [(f"system[{index}]", block.cache_control) for index, block in enumerate(system_blocks)]
    system_count = 1 if chat and chat[0].role is Role.SYSTEM else 0  # the system prompt, if `converted` made one
    hints = [(where, system_count, ttl) for where, ttl in _marked(breakpoints)]
    for index, message in enumerate(body.messages):
        if isinstance(message.content, list):
            marked = [
                (f"messages[{index}].content[{number}]", block.cache_control)
                for number, block in enumerate(message.content)
            ]
            hints += [(where, ends[index], ttl) for where, ttl in _marked(marked)]
    if len(hints) > MAX_BREAKPOINTS:
        raise ApiError(
            400,
            f"{len(hints)} blocks carry cache_control; at most {MAX_BREAKPOINTS} may (mark fewer)",
            param="cache_control",
        )
    return tuple(KeepHint(count, ttl) for _where, count, ttl in hints if count > 0)


def _marked(places: list[tuple[str, Any]]) -> list[tuple[str, float]]:
    """The places with a `cache_control`, each with its time to live in seconds; a 400 for a malformed one."""
    marked = []
    for where, control in places:
        if control is None:
            continue
        param = f"{where}.cache_control"
        if not isinstance(control, dict) or control.get("type") != "ephemeral":
            raise ApiError(400, f"{param} must be {{'type': 'ephemeral'}} (with 'ttl' '5m' or '1h')", param=param)
        ttl = control.get("ttl", "5m")
        if not isinstance(ttl, str) or ttl not in CACHE_TTLS:
            raise ApiError(400, f"{param}.ttl is {ttl!r}; use '5m' or '1h'", param=param)
        marked.append((where, CACHE_TTLS[ttl]))
    return marked


def content_blocks(outcome: CompletionOutcome) -> list[dict[str, Any]]:
    """The answer's text (if any), then each call as a tool_use block."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": outcome.text}] if outcome.text else []
    blocks += [tool_use_block(call) for call in outcome.tool_calls]
    return blocks


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    """A call as a tool_use block."""
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
