"""The conversation's messages: the one place that says what a prompt is made of.

Every surface (ask, the TUI, the HTTP API, the bench) turns its conversation into chat
messages here, so the same persona, document and history always give the same messages,
and so the same tokens:

- the persona, when there is one, is the first message (system);
- the document goes into the first user message, ahead of the question, in a fixed
  template and as its own content part, so every question about it shares that prefix;
- an answer the model wrote keeps its exact generated token ids, when they are known.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chatapp.documents import Document
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import Role

DOCUMENT_TEMPLATE = '<document name="{name}">\n{text}\n</document>\n\n'


@dataclass(frozen=True)
class Turn:
    """One message of a conversation as its surface keeps it: who, what, and the answer's ids."""

    role: Role
    text: str
    generated_ids: tuple[int, ...] | None = None  # an assistant answer's own tokens (None: unknown)


def document_block(document: Document) -> str:
    """The document as it appears in the prompt."""
    return DOCUMENT_TEMPLATE.format(name=document.name, text=document.text)


def question_message(text: str, document: Document | None) -> ChatMessage:
    """A user message; the document, when given, is its first content part."""
    if document is not None:
        return ChatMessage.of(Role.USER, document_block(document), text)
    return ChatMessage.of(Role.USER, text)


def conversation_messages(persona: str | None, document: Document | None, turns: Sequence[Turn]) -> list[ChatMessage]:
    """The chat messages for a persona, a document and the turns so far (the last may be the new question)."""
    messages = [ChatMessage.of(Role.SYSTEM, persona)] if persona else []
    carries_document = document
    for turn in turns:
        if turn.role is Role.USER:
            messages.append(question_message(turn.text, carries_document))
            carries_document = None
        elif turn.role is Role.ASSISTANT:
            messages.append(ChatMessage(role=Role.ASSISTANT, parts=(turn.text,), generated_ids=turn.generated_ids))
        else:
            messages.append(ChatMessage.of(turn.role, turn.text))
    return messages


def next_question_parts(document: Document | None, turns: Sequence[Turn]) -> tuple[str, ...]:
    """What the next user message holds before its text: the document, if no question came yet."""
    if document is None or any(turn.role is Role.USER for turn in turns):
        return ()
    return (document_block(document),)
