"""What the stores hand out: immutable snapshots of rows.

Records are frozen so that a UI holding one cannot mistake it for a live row; to change
something, ask the store and use the record it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SYSTEM = "system"
USER = "user"
ASSISTANT = "assistant"
ROLES = (SYSTEM, USER, ASSISTANT)

COMPLETE = "complete"
STOPPED = "stopped"  # the user stopped the answer
CUT_OFF = "cut_off"  # the answer hit the token or context limit
PARTIAL = "partial"  # saved while streaming; finished later with update_message
STATUSES = (COMPLETE, STOPPED, CUT_OFF, PARTIAL)


@dataclass(frozen=True)
class MessageRecord:
    """One node of a conversation's tree; roots (role "system") carry the persona and document."""

    id: int
    conversation_id: int
    parent_id: int | None  # None only for a root
    role: str  # "system" (roots only), "user", "assistant"
    content: str  # for a root: the persona prompt ("" when none)
    created_at: float  # time.time()
    generated_ids: tuple[int, ...] | None = None  # assistant: the model's exact token ids
    stats: dict[str, Any] | None = field(default=None, hash=False)  # assistant: figures of the answer
    status: str = COMPLETE
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
