"""Rendering a model's own Jinja chat template, as Hugging Face's tokenizers do.

The template string comes from the GGUF metadata (`tokenizer.chat_template`). It runs in
a sandbox: a model file is input, and its template must not reach the Python runtime.
"""

from __future__ import annotations

import copy
import datetime
import json
from dataclasses import dataclass, field
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from chatapp.errors import ChatappError, ModelError

# Used when a GGUF file carries no template at all.
FALLBACK_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# A model given the fallback was not taught it: where it has no such special tokens (a base model), it
# writes a turn's end as text, and would go on writing the next turns. That text ends its answer.
FALLBACK_TURN_ENDS = ("<|im_end|>", "<|im_start|>")


class TemplateRenderError(ChatappError):
    """The template raised or could not render these messages (a user-facing, one-line error)."""


REFUSED = "the model's chat template refused this conversation ({}); start a new branch or use another model"


def _tojson(value: Any, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
    """JSON as Hugging Face renders it for templates (Jinja's own escapes `<` and sorts keys).

    Models were trained on that text: tools and call arguments must read the same here.
    """
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise TemplateRenderError(REFUSED.format(message))


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled chat template plus the special-token strings it refers to."""

    source: str
    bos_token: str
    eos_token: str
    # Templates that print today's date would change a prompt's beginning at midnight and
    # defeat the cache: the date is fixed when the template is loaded.
    today: datetime.datetime = field(default_factory=datetime.datetime.now)
    # Variables a request sets for the template (a reasoning model's switch: `enable_thinking`,
    # `reasoning_effort`); a template that does not read them renders as without.
    variables: tuple[tuple[str, Any], ...] = ()

    @property
    def turn_ends(self) -> tuple[str, ...]:
        """Text that ends the model's turn when written as text (the fallback's markers); none for a model's own
        template, whose turns end with its end tokens."""
        return FALLBACK_TURN_ENDS if self.source == FALLBACK_CHATML else ()

    _compiled: jinja2.Template = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=None)
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = self.today.strftime
        environment.filters["tojson"] = _tojson
        try:
            compiled = environment.from_string(self.source)
        except jinja2.TemplateError as error:
            raise ModelError(f"the model's chat template does not compile ({error}); use another GGUF file") from None
        object.__setattr__(self, "_compiled", compiled)

    def with_variables(self, variables: tuple[tuple[str, Any], ...]) -> ChatTemplate:
        """The same template, rendered with these variables set (the compiled template is shared)."""
        derived = copy.copy(self)
        object.__setattr__(derived, "variables", variables)
        return derived

    def reads(self, name: str) -> bool:
        """Whether the template refers to the variable `name` (a cheap look at its source)."""
        return name in self.source

    def render(
        self, messages: list[dict[str, Any]], *, add_generation_prompt: bool, tools: list[dict[str, Any]] | None = None
    ) -> str:
        """The template's text for `messages` (and `tools`, when given); TemplateRenderError when it refuses them."""
        extra = {"tools": tools} if tools else {}
        try:
            return self._compiled.render(
                **dict(self.variables),
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except TemplateRenderError:
            raise
        except (jinja2.TemplateError, TypeError, KeyError, IndexError, ValueError) as error:
            raise TemplateRenderError(REFUSED.format(error)) from None
