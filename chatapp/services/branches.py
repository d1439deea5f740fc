"""The open branch of a conversation: what the message view shows and what the prompt is built from.

A conversation is a tree. Its roots carry the persona and the document; a branch is the
path from a root to a leaf. Each message on it knows how many siblings it has, so the
view can show "2/3" and move between them.
"""

from __future__ import annotations

from dataclasses import dataclass

from chatapp.documents import Document
from chatapp.prompting.prompt import ChatMessage
from chatapp.records import ConversationRecord, DocumentRecord, MessageRecord
from chatapp.services.messages import Turn, conversation_messages


@dataclass(frozen=True)
class BranchMessage:
    """A message on the open branch and its place among its siblings (1-based)."""

    record: MessageRecord
    position: int
    siblings: int
    shown: str = ""  # what the screen shows: a harmony answer's reply without its reasoning, else the content


@dataclass(frozen=True)
class BranchView:
    """Everything the message view needs about the open branch."""

    conversation: ConversationRecord
    root: MessageRecord
    root_position: int
    root_count: int
    document: DocumentRecord | None
    messages: tuple[BranchMessage, ...]  # user and assistant messages, root excluded

    @property
    def persona_name(self) -> str | None:
        return self.root.persona_name

    @property
    def leaf(self) -> MessageRecord:
        return self.messages[-1].record if self.messages else self.root

    def message(self, message_id: int) -> BranchMessage | None:
        return next((m for m in self.messages if m.record.id == message_id), None)


def as_document(record: DocumentRecord | None) -> Document | None:
    return Document(name=record.name, text=record.text) if record is not None else None


def branch_turns(path: list[MessageRecord]) -> list[Turn]:
    """The turns of a branch (root excluded), answers with their saved token ids."""
    return [Turn(record.role, record.content, record.generated_ids) for record in path]


def prompt_messages(root: MessageRecord, document: Document | None, path: list[MessageRecord]) -> list[ChatMessage]:
    """The chat messages a branch's prompt is built from: the root's persona and document, then the turns."""
    return conversation_messages(root.content, document, branch_turns(path))
