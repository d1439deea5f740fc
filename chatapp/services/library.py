"""The conversations database in the data folder, and the stores that use it."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from chatapp.services.startup import Workspace
from chatapp.store.conversations import ConversationStore
from chatapp.store.database import open_database
from chatapp.store.personas import PersonaStore, bundled_personas_dir
from chatapp.store.pins import PinStore

DATABASE_NAME = "chatapp.sqlite3"


@dataclass
class Library:
    connection: sqlite3.Connection
    conversations: ConversationStore
    personas: PersonaStore
    pins: PinStore

    def close(self) -> None:
        self.connection.close()


def open_library(workspace: Workspace) -> Library:
    """Open (creating or migrating) the database; StoreError names the problem and the fix."""
    connection = open_database(workspace.paths.root / DATABASE_NAME)
    return Library(
        connection=connection,
        conversations=ConversationStore(connection),
        personas=PersonaStore(connection, bundled_personas_dir()),
        pins=PinStore(connection),
    )
