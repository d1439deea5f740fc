"""Tools, tool choice, response formats and chat messages of both APIs, read into the app's terms.

OpenAI and Ollama spell the same things a little differently (arguments as JSON text or as
an object, `tool_call_id` or `tool_name`, `response_format` or `format`); each becomes an
`AnswerShape` and `ApiMessage`s here, and any field at fault is a 400 that names it.
"""

from __future__ import annotations

import json
from typing import Any

from chatapp.server.errors import ApiError
from chatapp.server.schemas import refuse_unsupported, role_of
from chatapp.services.answer_shape import AnswerShape, ShapeError, ToolChoice, json_object_shape, schema_shape
from chatapp.services.completions import ApiMessage
from chatapp.tools import ToolCall, ToolSpec, arguments_json, compact_json
from chatapp.vocabulary import Role

TOOL_CHOICES = {choice.value: choice for choice in (ToolChoice.AUTO, ToolChoice.NONE, ToolChoice.REQUIRED)}


def tool_specs(tools: Any, param: str = "tools") -> tuple[ToolSpec, ...]:
    """OpenAI-shaped tools (Ollama uses the same shape); a 400 naming the first one at fault."""
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise ApiError(400, f"{param} must be a list of tools", param=param)
    specs = []
    for index, tool in enumerate(tools):
        where = f"{param}[{index}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise ApiError(400, f"{where} is not a function tool; only type 'function' is supported", param=where)
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise ApiError(400, f"{where}.function.name is missing; name each function", param=where)
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise ApiError(400, f"{where}.function.parameters must be a JSON schema object", param=where)
        description = function.get("description") or ""
        # The client's own key order: a grammar writes properties in that order (reasoning first, say).
        specs.append(ToolSpec(function["name"], str(description), compact_json(parameters)))
    names = [spec.name for spec in specs]
    repeated = next((name for name in names if names.count(name) > 1), None)
    if repeated is not None:
        raise ApiError(400, f"{param} names the function {repeated!r} twice; give each tool its own name", param=param)
    return tuple(specs)


def openai_shape(fields: dict[str, Any]) -> AnswerShape:
    """`tools`, `tool_choice`, `parallel_tool_calls` and `response_format` of an OpenAI chat request."""
    tools = tool_specs(fields.get("tools"))
    choice, function = _tool_choice(fields.get("tool_choice"), bool(tools))
    parallel = fields.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(400, f"parallel_tool_calls is {parallel!r}; send true or false", param="parallel_tool_calls")
    try:
        shape = _response_format(fields.get("response_format"))
    except ShapeError as error:
        raise ApiError(400, str(error), param=error.param) from None
    return AnswerShape(
        tools=tools,
        choice=choice,
        function=function,
        parallel=bool(parallel),  # one call per answer unless asked (llama-server's default): small models loop
        json_schema=shape.json_schema,
        schema_param=shape.schema_param,
    )


def ollama_shape(fields: dict[str, Any]) -> AnswerShape:
    """`tools` and `format` ("json" or a schema) of an Ollama request."""
    tools = tool_specs(fields.get("tools"))
    form = fields.get("format")
    try:
        if form in (None, ""):
            shape = AnswerShape()
        elif form == "json":
            shape = json_object_shape("format")
        else:
            shape = schema_shape(form, "format")
    except ShapeError as error:
        raise ApiError(400, str(error), param=error.param) from None
    return AnswerShape(tools=tools, json_schema=shape.json_schema, schema_param=shape.schema_param)


def _tool_choice(value: Any, has_tools: bool) -> tuple[ToolChoice, str | None]:
    if value is None:
        return ToolChoice.AUTO, None
    if isinstance(value, str) and value in TOOL_CHOICES:
        choice = TOOL_CHOICES[value]
    elif (
        isinstance(value, dict)
        and isinstance(value.get("function"), dict)
        and isinstance(value["function"].get("name"), str)
    ):
        choice = ToolChoice.FUNCTION
    else:
        raise ApiError(
            400,
            "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}",
            param="tool_choice",
        )
    if choice in (ToolChoice.REQUIRED, ToolChoice.FUNCTION) and not has_tools:
        raise ApiError(400, "tool_choice asks for a call but the request has no tools; send tools", param="tool_choice")
    return choice, value["function"]["name"] if choice is ToolChoice.FUNCTION else None


def _response_format(value: Any) -> AnswerShape:
    if value is None or value == "":
        return AnswerShape()
    if not isinstance(value, dict):
        raise ApiError(
            400, "response_format must be an object such as {'type': 'json_object'}", param="response_format"
        )
    kind = value.get("type")
    if kind in (None, "text"):
        return AnswerShape()
    if kind == "json_object":
        return json_object_shape("response_format")
    if kind == "json_schema":
        described = value.get("json_schema")
        schema = described.get("schema") if isinstance(described, dict) else None
        if schema is None:
            missing = "response_format.json_schema.schema is missing; send the schema"
            raise ApiError(400, missing, param="response_format")
        return schema_shape(schema, "response_format.json_schema.schema")
    unknown = f"response_format type {kind!r} is not supported; use text, json_object or json_schema"
    raise ApiError(400, unknown, param="response_format")


def chat_message(
    index: int, role_name: str, text: str, fields: dict[str, Any], unsupported: dict[str, Any]
) -> ApiMessage:
    """One message of either API: an assistant's calls, a tool result's call id and name.

    Fields in `unsupported` at a value that changes the answer, an unknown role and empty
    text from the system or the user are a 400.
    """
    refuse_unsupported(fields, unsupported, prefix=f"messages[{index}].")
    role = role_of(role_name, index)
    where = f"messages[{index}]"
    calls = _calls(fields.get("tool_calls"), f"{where}.tool_calls", index) if role is Role.ASSISTANT else ()
    if role in (Role.SYSTEM, Role.USER) and not text.strip():
        raise ApiError(400, f"{where}.content is empty; send some text", param=where)
    call_id = fields.get("tool_call_id") or ""
    name = fields.get("tool_name") or fields.get("name") or ""
    if role is Role.TOOL:
        return ApiMessage(role, text, tool_call_id=str(call_id), name=str(name))
    return ApiMessage(role, text, tool_calls=calls)


def _calls(value: Any, param: str, message_index: int) -> tuple[ToolCall, ...]:
    if not value:
        return ()
    if not isinstance(value, list):
        raise ApiError(400, f"{param} must be a list of calls", param=param)
    calls = []
    for number, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ApiError(400, f"{param}[{number}].function.name is missing", param=param)
        call_id = call.get("id") or f"call_{message_index}_{number}"  # Ollama's calls carry no id
        arguments = request_arguments(function.get("arguments", {}), f"{param}[{number}].function.arguments")
        calls.append(ToolCall(str(call_id), function["name"], arguments))
    return tuple(calls)


def request_arguments(value: Any, param: str) -> str:
    """A call's arguments from a request's history as canonical JSON; a 400 when they are text that is not
    JSON (OpenAI refuses those too: the model would be shown a call it could never have made)."""
    if isinstance(value, str) and value.strip():
        try:
            json.loads(value)
        except json.JSONDecodeError as error:
            raise ApiError(
                400, f"{param} is not JSON ({error.msg}); send the arguments as a JSON object", param=param
            ) from None
    return arguments_json(value)


def openai_call(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    """A call as OpenAI writes it (arguments as JSON text); `index` for a streamed delta."""
    entry: dict[str, Any] = {} if index is None else {"index": index}
    function = {"name": call.name, "arguments": call.arguments_json}
    return {**entry, "id": call.id, "type": "function", "function": function}


def ollama_call(call: ToolCall) -> dict[str, Any]:
    """A call as Ollama writes it (arguments as an object)."""
    return {"function": {"name": call.name, "arguments": call.arguments}}
