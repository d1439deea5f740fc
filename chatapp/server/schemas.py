"""Request bodies of the OpenAI and Ollama APIs, and the parameters the server refuses.

Fields the server does not know are ignored (clients send plenty that changes nothing, such
as `user`); fields known to change the answer in a way it cannot honour
(several choices, log probabilities, penalties, images...) are refused with a 400 that
names them, unless they hold the value that changes nothing. Tools and response formats are
read in tool_fields.py.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from chatapp.server.errors import ApiError
from chatapp.vocabulary import Role

MAX_STOP_STRINGS = 16
SEED_LIMIT = 2**32

ROLES = {
    "system": Role.SYSTEM,
    "developer": Role.SYSTEM,
    "user": Role.USER,
    "assistant": Role.ASSISTANT,
    "tool": Role.TOOL,
}


def _unset(value: Any) -> bool:
    return value is None or value is False or value == 0 or value == [] or value == {} or value == ""


def _is_one(value: Any) -> bool:
    return value is None or value == 1


# name -> the values that change nothing (anything else is refused)
OPENAI_UNSUPPORTED = {
    "n": _is_one,
    "best_of": _is_one,
    "functions": _unset,  # the old form of tools: clients send `tools` now
    "function_call": lambda value: value is None or value == "none",
    "logprobs": _unset,
    "top_logprobs": _unset,
    "frequency_penalty": _unset,
    "presence_penalty": _unset,
    "logit_bias": _unset,
    "echo": _unset,
    "suffix": _unset,
    "audio": _unset,
    "modalities": lambda value: value is None or value == ["text"],
    "prediction": _unset,
}
# A plain completion has no tools and no response format: there they would change nothing, silently.
COMPLETION_UNSUPPORTED = {
    **OPENAI_UNSUPPORTED,
    "tools": _unset,
    "tool_choice": lambda value: value is None or value == "none",
    "response_format": lambda value: value is None or (isinstance(value, dict) and value.get("type") == "text"),
}
OPENAI_MESSAGE_UNSUPPORTED = {"function_call": _unset, "audio": _unset}
OLLAMA_UNSUPPORTED = {
    "images": _unset,
    "suffix": _unset,
    "template": _unset,
    "context": _unset,
    "logprobs": _unset,
    "top_logprobs": _unset,
}
OLLAMA_GENERATE_UNSUPPORTED = {**OLLAMA_UNSUPPORTED, "tools": _unset}  # generate takes no tools
OLLAMA_OPTIONS_UNSUPPORTED = {
    "num_keep": lambda value: True,
    "min_p": _unset,
    "typical_p": lambda value: value is None or value == 1,
    "repeat_penalty": lambda value: value is None or value == 1,
    "presence_penalty": _unset,
    "frequency_penalty": _unset,
    "mirostat": _unset,
}


def refuse_unsupported(fields: dict[str, Any], table: dict[str, Any], prefix: str = "") -> None:
    """A 400 naming the first field in `fields` that `table` cannot honour at its value."""
    for name, harmless in table.items():
        if name in fields and not harmless(fields[name]):
            raise ApiError(
                400,
                f"{prefix}{name} is not supported by this server (it serves one plain text answer); "
                f"remove it from the request",
                param=f"{prefix}{name}",
            )


def role_of(name: str, index: int) -> Role:
    role = ROLES.get(name)
    if role is None:
        raise ApiError(
            400,
            f"messages[{index}].role is {name!r}; use system, user, assistant or tool",
            param=f"messages[{index}].role",
        )
    return role


def checked_stop(stop: str | list[str] | None, param: str) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if len(stops) > MAX_STOP_STRINGS:
        raise ApiError(400, f"{param} has {len(stops)} strings; send at most {MAX_STOP_STRINGS}", param=param)
    return tuple(text for text in stops if text)


class Lenient(BaseModel):
    """Unknown fields are kept (to be checked against the refusal tables), never an error."""

    model_config = ConfigDict(extra="allow")

    def fields_sent(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class ContentPart(Lenient):
    type: str
    text: str | None = None


class OpenAIMessage(Lenient):
    role: str
    content: str | list[ContentPart] | None = None

    def text(self, index: int) -> str:
        """The message's text; images and other parts are refused."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        pieces = []
        for number, part in enumerate(self.content):
            if part.type != "text" or part.text is None:
                raise ApiError(
                    400,
                    f"messages[{index}].content[{number}] is of type {part.type!r}; this server reads text only",
                    param=f"messages[{index}].content",
                )
            pieces.append(part.text)
        return "".join(pieces)


class StreamOptions(Lenient):
    include_usage: bool = False


class OpenAISampling(Lenient):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None  # llama-server's and vLLM's extension: answers of a known length


class ChatCompletionBody(OpenAISampling):
    messages: list[OpenAIMessage]
    max_completion_tokens: int | None = Field(None, ge=1)


class CompletionBody(OpenAISampling):
    prompt: str | list[str] | list[int]  # one text, or one prompt as token ids


class OllamaOptions(Lenient):
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT)
    num_predict: int | None = None
    stop: list[str] | None = None


class OllamaMessage(Lenient):
    role: str
    content: str | None = ""


class OllamaBase(Lenient):
    model: str
    stream: bool = True  # Ollama streams unless told not to
    options: OllamaOptions | None = None
    keep_alive: float | str | None = None  # how long the model stays loaded after this request (Ollama's)


class OllamaChatBody(OllamaBase):
    messages: list[OllamaMessage]


class OllamaGenerateBody(OllamaBase):
    prompt: str = ""
    system: str | None = None
    raw: bool = False
