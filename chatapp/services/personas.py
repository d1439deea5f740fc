"""Personas as the screens use them: list, save what the editor holds, copy, delete, import, export.

The persona screen works through this service, never the store: saving decides between
creating and updating, and every failure is a ChatappError with one line to show.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from chatapp.errors import PersonaError
from chatapp.records import PersonaRecord
from chatapp.store.personas import PersonaStore


class PersonaService:
    def __init__(self, store: PersonaStore, forget: Callable[[PersonaRecord], object] = lambda persona: None) -> None:
        """`forget`: removes from the cache what only a persona about to be deleted used."""
        self._store = store
        self._forget = forget

    def all(self) -> list[PersonaRecord]:
        """Every persona, by name."""
        return self._store.list()

    def get(self, persona_id: int) -> PersonaRecord:
        return self._store.get(persona_id)

    def named(self, name: str) -> PersonaRecord | None:
        """The persona called `name` (as the store matches names), or None."""
        try:
            return self._store.get_by_name(name)
        except PersonaError:
            return None

    def save(self, editing: PersonaRecord | None, name: str, prompt: str) -> PersonaRecord:
        """Create a persona from the editor, or update the one being edited."""
        if editing is None:
            return self._store.create(name, prompt)
        return self._store.update(editing.id, name=name, prompt=prompt)

    def duplicate(self, persona: PersonaRecord) -> PersonaRecord:
        return self._store.duplicate(persona.id)

    def delete(self, persona: PersonaRecord) -> None:
        """Delete the persona, and from the cache what only it used (conversations keep their copy)."""
        self._forget(persona)
        self._store.delete(persona.id)

    def import_file(self, path: Path) -> PersonaRecord:
        return self._store.import_file(path)

    def export(self, persona: PersonaRecord, path: Path) -> Path:
        """Write the persona as Markdown (a folder gets `<name>.md` inside it); the file written."""
        return self._store.export(persona.id, path)
