"""What the stores hand out and the services pass on: immutable snapshots of rows.

Records are frozen so that a UI holding one cannot mistake it for a live row; to change
something, ask a service and use the record it returns. They live outside the store so
that the screens can read them without reaching into the database layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chatapp.vocabulary import MessageStatus, Role


@dataclass(frozen=True)
class MessageRecord:
    """One node of a conversation's tree; roots (role "system") carry the persona and document."""

    id: int
    conversation_id: int
    parent_id: int | None  # None only for a root
    role: Role  # SYSTEM for roots only
    content: str  # for a root: the persona prompt ("" when none)
    created_at: float  # time.time()
    generated_ids: tuple[int, ...] | None = None  # assistant: the model's exact token ids
    stats: dict[str, Any] | None = field(default=None, hash=False)  # assistant: figures of the answer
    status: MessageStatus = MessageStatus.COMPLETE
    persona_name: str | None = None  # roots only
    document_id: int | None = None  # roots only: the document this branch is about

    @property
    def is_root(self) -> bool:
        return self.parent_id is None


@dataclass(frozen=True)
class ConversationRecord:
    """A conversation's header; its messages live in the tree under its roots."""

    id: int
    title: str
    created_at: float
    updated_at: float
    active_leaf_id: int | None
    qa_mode: bool = False
    model: str | None = None  # the model file it was last answered with (None: from before models were kept)


@dataclass(frozen=True)
class DocumentRecord:
    """A document's text as it was given to the model; shared by every branch about it."""

    id: int
    name: str
    text: str
    source_path: str
    added_at: float


@dataclass(frozen=True)
class PersonaRecord:
    """A named system prompt; `bundled` says it came with chatapp."""

    id: int
    name: str
    prompt: str
    bundled: bool
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class PinRecord:
    """A prefix kept out of eviction: a persona, a persona with a document (pinned by the user, until
    unpinned), or a prefix a request marked for keeping (until it expires)."""

    id: int
    kind: str  # "persona" | "document" | "request" (a client's cache_control)
    label: str
    tokens: tuple[int, ...]
    created_at: float
    expires_at: float | None = None  # None: until the user unpins it
    namespace: str = ""  # the cache namespace (model) whose blocks it holds; "" when not known
