"""Persistent state: conversations as message trees, documents and personas, in one SQLite file."""

from __future__ import annotations

from chatapp.records import (
    ConversationRecord,
    DocumentRecord,
    MessageRecord,
    PersonaRecord,
)
from chatapp.store.conversations import ConversationStore
from chatapp.store.database import SCHEMA_VERSION, open_database
from chatapp.store.personas import PersonaStore, bundled_personas_dir

__all__ = [
    "SCHEMA_VERSION",
    "ConversationRecord",
    "ConversationStore",
    "DocumentRecord",
    "MessageRecord",
    "PersonaRecord",
    "PersonaStore",
    "bundled_personas_dir",
    "open_database",
]
