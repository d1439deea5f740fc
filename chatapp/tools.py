"""Tools a model may call, the calls it made and their results, as prompts and templates see them.

Every field is text, so a message holding them stays hashable (the prompt builder remembers
the tokens of histories it has built) and two requests that say the same thing build the
same prompt: a tool's schema and a call's arguments are kept as canonical JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


def canonical_json(value: Any) -> str:
    """One spelling for one value: keys sorted, no spaces, characters as they are."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def compact_json(value: Any) -> str:
    """JSON without spaces, keys in the order given (a schema's property order is meaningful)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call: its name, what it does and its parameters' JSON schema."""

    name: str
    description: str = ""
    parameters_json: str = '{"type":"object","properties":{}}'

    @property
    def parameters(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.parameters_json)
        return value

    def template_input(self) -> dict[str, Any]:
        """The OpenAI shape chat templates expect (`tools` in Hugging Face's convention)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the id the server gave it, the function's name and its arguments (JSON text)."""

    id: str
    name: str
    arguments_json: str

    @property
    def arguments(self) -> Any:
        return json.loads(self.arguments_json)

    def template_input(self) -> dict[str, Any]:
        """Arguments as an object: most templates print them with `tojson`."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def signature(self) -> tuple[str, str]:
        """What identifies the call whoever serialized it: its name and its arguments as canonical JSON."""
        return self.name, self.arguments_json


@dataclass(frozen=True)
class ToolResult:
    """What a tool returned for the call `call_id`."""

    call_id: str
    name: str
    content: str

    def template_input(self, content: str) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": self.call_id, "name": self.name, "content": content}


def arguments_json(arguments: Any) -> str:
    """A call's arguments as canonical JSON, from an object or from JSON text (clients send either).

    Text that is not JSON is kept as a JSON string, so nothing the client sent is lost.
    """
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return canonical_json(arguments)
    return canonical_json(arguments)
