"""A conversation as the engine sees it: persona, document, and the messages so far.

The document goes into the first user message, ahead of the question, in a fixed
template and as its own content part, so the same document always yields the same
tokens right after the persona: every question about it shares that prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chatapp.documents import Document
from chatapp.engine.prompt import ChatMessage
from chatapp.vocabulary import Role

DOCUMENT_TEMPLATE = '<document name="{name}">\n{text}\n</document>\n\n'


def document_block(document: Document) -> str:
    """The document as it appears in the prompt."""
    return DOCUMENT_TEMPLATE.format(name=document.name, text=document.text)


def question_message(text: str, document: Document | None) -> ChatMessage:
    """A user message; the document, when given, is its first content part."""
    if document is not None:
        return ChatMessage.of(Role.USER, document_block(document), text)
    return ChatMessage.of(Role.USER, text)


@dataclass
class Conversation:
    """An append-only list of messages with an optional persona and document."""

    system_prompt: str | None = None
    document: Document | None = None
    messages: list[ChatMessage] = field(default_factory=list)

    def add_user(self, text: str) -> ChatMessage:
        """Append a user message; the first one carries the document, if any."""
        is_first_question = not any(message.role == Role.USER for message in self.messages)
        message = question_message(text, self.document if is_first_question else None)
        self.messages.append(message)
        return message

    def add_answer(self, text: str, token_ids: tuple[int, ...]) -> ChatMessage:
        """Append the model's answer with its exact token ids."""
        message = ChatMessage(role=Role.ASSISTANT, parts=(text,), generated_ids=token_ids)
        self.messages.append(message)
        return message

    def drop_last(self) -> None:
        self.messages.pop()

    def prompt_messages(self) -> list[ChatMessage]:
        """Everything the prompt is built from, persona first."""
        persona = [ChatMessage.of(Role.SYSTEM, self.system_prompt)] if self.system_prompt else []
        return persona + self.messages
