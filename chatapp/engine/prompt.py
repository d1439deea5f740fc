"""Building prompts that only ever grow: the tokens of turn k+1 begin with turn k's.

Rendering the whole conversation and tokenizing it again would let the tokenizer split the
text differently from what the model generated, and every such change invalidates the KV
cache from that point on. Instead each message becomes tokens on its own:

- its text segment is what the model's own template adds for it (the render of the
  history plus the message, minus the render of the history);
- the template's own text in that segment is tokenized with special tokens parsed, the
  user's content without (so typed `<|im_end|>` stays text), each content part apart
  (a document's tokens do not depend on the question after it);
- an assistant message the model wrote contributes the generation header it was
  generated after, its exact generated token ids, and the template's closing text.

A message's tokens depend only on the messages before it, so a prompt is a pure function
of the conversation, and appending a message appends tokens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Protocol

from chatapp.engine.chat_template import ChatTemplate, TemplateRenderError

log = logging.getLogger(__name__)

SYSTEM = "system"
USER = "user"
ASSISTANT = "assistant"
# Stands in for a message's content to find where the template puts it.
CONTENT_SENTINEL = "\x00chatapp-content\x00"


@dataclass(frozen=True)
class ChatMessage:
    """One message. `parts` are tokenized separately; `generated_ids` are the model's own tokens."""

    role: str
    parts: tuple[str, ...]
    generated_ids: tuple[int, ...] | None = None

    @classmethod
    def of(cls, role: str, *parts: str) -> ChatMessage:
        return cls(role=role, parts=tuple(parts))

    @property
    def content(self) -> str:
        return "".join(self.parts)

    def as_template_input(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


class Tokenizer(Protocol):
    """What the builder needs from a model's vocabulary."""

    add_bos: bool
    bos_id: int

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...


class PromptBuilder:
    """Turns a list of messages into prompt tokens with the model's own chat template."""

    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer) -> None:
        self.template = template
        self.tokenizer = tokenizer
        self.supports_system = self._accepts_system_messages()

    def build(self, messages: list[ChatMessage], *, add_generation_prompt: bool = True) -> list[int]:
        """The prompt tokens for `messages`, ending with the assistant header when asked."""
        messages = self._fold_system_messages(messages)
        # What the template prints before any message (often the BOS text).
        tokens = self._template_tokens(self._render_history([])) if messages else []
        for index, message in enumerate(messages):
            tokens += self.message_tokens(messages[:index], message)
        if add_generation_prompt:
            tokens += self._template_tokens(self.generation_header_text(messages))
        if self.tokenizer.add_bos and (not tokens or tokens[0] != self.tokenizer.bos_id):
            tokens.insert(0, self.tokenizer.bos_id)
        return tokens

    def message_tokens(self, history: list[ChatMessage], message: ChatMessage) -> list[int]:
        """The tokens `message` adds after `history` (BOS aside)."""
        before = self._render_history(history)
        sentinel_segment = self._segment(before, history, replace(message, parts=(CONTENT_SENTINEL,), generated_ids=None))
        prefix, found, suffix = sentinel_segment.partition(CONTENT_SENTINEL)
        found = bool(found) and CONTENT_SENTINEL not in suffix
        if message.generated_ids is not None:
            closing = suffix if found else ""
            return (
                self._template_tokens(self.generation_header_text(history))
                + list(message.generated_ids)
                + self._template_tokens(closing)
            )
        actual_segment = self._segment(before, history, message)
        if found and actual_segment == prefix + message.content + suffix:
            content_tokens = [token for part in message.parts for token in self._content_tokens(part)]
            return self._template_tokens(prefix) + content_tokens + self._template_tokens(suffix)
        if found and actual_segment.startswith(prefix) and actual_segment.endswith(suffix):
            # The template changed the content (trimmed it, say): keep its version.
            middle = actual_segment[len(prefix) : len(actual_segment) - len(suffix)]
            return self._template_tokens(prefix) + self._content_tokens(middle) + self._template_tokens(suffix)
        return self._template_tokens(actual_segment)

    def generation_header_text(self, history: list[ChatMessage]) -> str:
        """What the template appends to `history` to ask for an assistant answer."""
        without = self._render_history(history)
        with_header = self.template.render([m.as_template_input() for m in history], add_generation_prompt=True)
        if with_header.startswith(without):
            return with_header[len(without) :]
        log.warning("chat template's generation prompt does not extend the history; using the assistant prefix")
        probe = self._segment(without, history, ChatMessage.of(ASSISTANT, CONTENT_SENTINEL))
        return probe.partition(CONTENT_SENTINEL)[0]

    def _accepts_system_messages(self) -> bool:
        """Some templates (Gemma's, Mistral's) refuse a system role."""
        probe = [{"role": SYSTEM, "content": "s"}, {"role": USER, "content": "u"}]
        try:
            self.template.render(probe, add_generation_prompt=True)
        except TemplateRenderError:
            return False
        return True

    def _fold_system_messages(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        """Without a system role, the persona becomes the first part of the first user message."""
        if self.supports_system or not messages or messages[0].role != SYSTEM:
            return messages
        persona, rest = messages[0], messages[1:]
        if rest and rest[0].role == USER:
            first = rest[0]
            return [replace(first, parts=(persona.content + "\n\n", *first.parts)), *rest[1:]]
        return [ChatMessage.of(USER, persona.content), *rest]

    def _render_history(self, history: list[ChatMessage]) -> str:
        try:
            return self.template.render([m.as_template_input() for m in history], add_generation_prompt=False)
        except TemplateRenderError:
            if history:
                raise
            return ""  # Some templates index messages[0] and cannot render nothing.

    def _segment(self, before: str, history: list[ChatMessage], message: ChatMessage) -> str:
        """The text the template adds for `message` after `history` (rendered as `before`)."""
        after = self.template.render([m.as_template_input() for m in [*history, message]], add_generation_prompt=False)
        if after.startswith(before):
            return after[len(before) :]
        # The template rewrites earlier text when a message is added; the prompt must not
        # change behind us, so render the message on its own instead.
        log.warning("chat template is not prefix-stable for a %s message; rendering it alone", message.role)
        alone = self.template.render([message.as_template_input()], add_generation_prompt=False)
        empty = self._render_history([])
        return alone[len(empty) :] if alone.startswith(empty) else alone

    def _template_tokens(self, text: str) -> list[int]:
        return self.tokenizer.tokenize(text, add_special=False, parse_special=True) if text else []

    def _content_tokens(self, text: str) -> list[int]:
        return self.tokenizer.tokenize(text, add_special=False, parse_special=False) if text else []
