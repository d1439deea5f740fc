"""Personas: named system prompts, kept in the database and exchanged as Markdown files.

File format (bundled, import, export): UTF-8 text; a first line `# Name` gives the name and
the rest is the prompt; without it the name comes from the file name and the whole text is
the prompt. Bundled personas are seeded once per name, so a user's deletion sticks.
"""

from __future__ import annotations

import builtins
import logging
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatapp.atomic_write import write_text_atomically
from chatapp.errors import PersonaError
from chatapp.records import PersonaRecord
from chatapp.store.database import transaction

MAX_NAME_LENGTH = 80
MAX_FILE_BYTES = 1 << 20  # a prompt is text for a context window, not a book
_COLUMNS = "id, name, prompt, bundled, created_at, updated_at"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

logger = logging.getLogger(__name__)


def bundled_personas_dir() -> Path:
    """Where the personas shipped with chatapp live (the project is installed editable)."""
    return Path(__file__).resolve().parents[2] / "assets" / "personas"


@dataclass(frozen=True)
class PersonaText:
    """A persona parsed from a file, before it has an id."""

    name: str
    prompt: str


def parse_persona_text(text: str, stem: str) -> PersonaText:
    """Split file text into name and prompt (see the module docstring); may return empty parts."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").lstrip("\ufeff")
    first, _, rest = text.partition("\n")
    if first.startswith("# "):
        return PersonaText(first[2:].strip(), rest.strip())
    return PersonaText(name_from_stem(stem), text.strip())


def name_from_stem(stem: str) -> str:
    """ "code-reviewer" → "Code reviewer"."""
    words = " ".join(re.sub(r"[-_]", " ", stem).split())
    return words[:1].upper() + words[1:]


def persona_markdown(name: str, prompt: str) -> str:
    return f"# {name}\n\n{prompt}\n"


def slug(name: str) -> str:
    """A file-name-safe form of a persona name: "Code reviewer" → "code-reviewer"."""
    text = re.sub(r"[^\w]+", "-", name.casefold(), flags=re.UNICODE).strip("-_")
    return text or "persona"


class PersonaStore:
    """Personas in the database, seeded from the bundled Markdown files."""

    def __init__(self, connection: sqlite3.Connection, bundled_dir: Path | None) -> None:
        self._connection = connection
        if bundled_dir is not None:
            self._seed(bundled_dir)

    def list(self) -> builtins.list[PersonaRecord]:
        """All personas by name, ignoring case."""
        with transaction(self._connection, write=False) as db:
            records = [_record(row) for row in db.execute(f"SELECT {_COLUMNS} FROM personas")]
        return sorted(records, key=lambda record: (record.name.casefold(), record.id))

    def get(self, persona_id: int) -> PersonaRecord:
        with transaction(self._connection, write=False) as db:
            return self._get(db, persona_id)

    def get_by_name(self, name: str) -> PersonaRecord:
        with transaction(self._connection, write=False) as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM personas WHERE name_key = ?", (_key(name),)).fetchone()
        if row is None:
            raise PersonaError(f"no persona named {name.strip()!r}; see the persona list (F2) or create it")
        return _record(row)

    def create(self, name: str, prompt: str) -> PersonaRecord:
        name, prompt = _check_name(name), _check_prompt(prompt)
        with transaction(self._connection) as db:
            self._check_free(db, name)
            return self._insert(db, name, prompt, bundled=False)

    def update(self, persona_id: int, *, name: str | None = None, prompt: str | None = None) -> PersonaRecord:
        with transaction(self._connection) as db:
            current = self._get(db, persona_id)
            new_name = _check_name(name) if name is not None else current.name
            new_prompt = _check_prompt(prompt) if prompt is not None else current.prompt
            self._check_free(db, new_name, except_id=persona_id)
            db.execute(
                "UPDATE personas SET name = ?, name_key = ?, prompt = ?, updated_at = ? WHERE id = ?",
                (new_name, _key(new_name), new_prompt, time.time(), persona_id),
            )
            return self._get(db, persona_id)

    def duplicate(self, persona_id: int) -> PersonaRecord:
        """A copy named "<name> (copy)", "<name> (copy 2)", … whichever is free first."""
        with transaction(self._connection) as db:
            original = self._get(db, persona_id)
            name = self._free_name(db, original.name, "copy")
            return self._insert(db, name, original.prompt, bundled=False)

    def delete(self, persona_id: int) -> None:
        with transaction(self._connection) as db:
            self._get(db, persona_id)
            db.execute("DELETE FROM personas WHERE id = ?", (persona_id,))

    def import_file(self, path: Path) -> PersonaRecord:
        """Add a persona from a file; a taken name gets " (imported)", then " (imported 2)", …"""
        parsed = read_persona_file(path)
        name = _check_name(parsed.name, source=path)
        prompt = _check_prompt(parsed.prompt, source=path)
        with transaction(self._connection) as db:
            if self._name_taken(db, name):
                name = self._free_name(db, name, "imported")
            return self._insert(db, name, prompt, bundled=False)

    def export(self, persona_id: int, path: Path) -> Path:
        """Write the persona as Markdown; a folder gets `<slug>.md` inside it. Returns the file."""
        record = self.get(persona_id)
        path = Path(path).expanduser()
        if path.is_dir():
            path = path / f"{slug(record.name)}.md"
        write_text_atomically(
            path, persona_markdown(record.name, record.prompt), what="the persona", error=PersonaError
        )
        return path

    # --- helpers -----------------------------------------------------------------------

    def _seed(self, bundled_dir: Path) -> None:
        files = sorted(bundled_dir.glob("*.md")) if bundled_dir.is_dir() else []
        parsed: list[PersonaText] = []
        for file in files:
            try:
                persona = read_persona_file(file)
                name = _check_name(persona.name, source=file)
                parsed.append(PersonaText(name, _check_prompt(persona.prompt, source=file)))
            except PersonaError as error:
                # A broken file shipped with chatapp must not stop the app from starting.
                logger.warning("skipping bundled persona: %s", error)
        if not parsed:
            return
        with transaction(self._connection) as db:
            for persona in parsed:
                key = _key(persona.name)
                if db.execute("SELECT 1 FROM seeded_personas WHERE name_key = ?", (key,)).fetchone():
                    continue
                # A persona the user already made under that name is theirs: keep it.
                if not self._name_taken(db, persona.name):
                    self._insert(db, persona.name, persona.prompt, bundled=True)
                db.execute("INSERT INTO seeded_personas (name_key, seeded_at) VALUES (?, ?)", (key, time.time()))

    def _get(self, db: sqlite3.Connection, persona_id: int) -> PersonaRecord:
        row = db.execute(f"SELECT {_COLUMNS} FROM personas WHERE id = ?", (persona_id,)).fetchone()
        if row is None:
            raise PersonaError(f"persona {persona_id} does not exist (deleted?); see the persona list (F2)")
        return _record(row)

    def _insert(self, db: sqlite3.Connection, name: str, prompt: str, *, bundled: bool) -> PersonaRecord:
        now = time.time()
        cursor = db.execute(
            "INSERT INTO personas (name, name_key, prompt, bundled, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
            (name, _key(name), prompt, int(bundled), now, now),
        )
        assert cursor.lastrowid is not None
        return self._get(db, cursor.lastrowid)

    def _name_taken(self, db: sqlite3.Connection, name: str, except_id: int | None = None) -> bool:
        row = db.execute("SELECT id FROM personas WHERE name_key = ?", (_key(name),)).fetchone()
        return row is not None and row[0] != except_id

    def _check_free(self, db: sqlite3.Connection, name: str, except_id: int | None = None) -> None:
        if self._name_taken(db, name, except_id):
            raise PersonaError(f"a persona named {name!r} already exists; choose another name")

    def _free_name(self, db: sqlite3.Connection, name: str, label: str) -> str:
        number = 1
        while True:
            suffix = f" ({label})" if number == 1 else f" ({label} {number})"
            candidate = name[: MAX_NAME_LENGTH - len(suffix)].rstrip() + suffix
            if not self._name_taken(db, candidate):
                return candidate
            number += 1


def read_persona_file(path: Path) -> PersonaText:
    """Read and parse a persona file; PersonaError (one line, with the fix) when it cannot be used."""
    path = Path(path).expanduser()
    if not path.exists():
        raise PersonaError(f"persona file {path} does not exist; check the path")
    if path.is_dir():
        raise PersonaError(f"persona file {path} is a folder; pass a .md or .txt file")
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise PersonaError(
                f"persona file {path} is too large ({size} bytes, at most {MAX_FILE_BYTES}); shorten the prompt"
            )
        data = path.read_bytes()
    except OSError as error:
        raise PersonaError(f"cannot read persona file {path} ({error.strerror}); check its permissions") from None
    if b"\x00" in data:
        raise PersonaError(f"persona file {path} looks binary (it contains NUL bytes); use a UTF-8 text file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise PersonaError(
            f"persona file {path} is not UTF-8 text (bad byte at offset {error.start}); convert it to UTF-8"
        ) from None
    if not text.strip():
        raise PersonaError(f"persona file {path} is empty; write the prompt in it (optionally under '# Name')")
    return parse_persona_text(text, path.stem)


def _key(name: str) -> str:
    return name.strip().casefold()


def _check_name(name: str, *, source: Path | None = None) -> str:
    where = f" (in {source})" if source is not None else ""
    name = name.strip()
    if not name:
        raise PersonaError(f"a persona needs a name{where}; type one (up to {MAX_NAME_LENGTH} characters)")
    if len(name) > MAX_NAME_LENGTH:
        raise PersonaError(
            f"persona name {name[:20]!r}… is {len(name)} characters{where}; shorten it to {MAX_NAME_LENGTH}"
        )
    if _CONTROL.search(name):
        raise PersonaError(f"persona name {name!r} contains control characters{where}; use one line of plain text")
    return name


def _check_prompt(prompt: str, *, source: Path | None = None) -> str:
    prompt = prompt.strip()
    if not prompt:
        where = f" ({source} has only a '# Name' line)" if source is not None else ""
        raise PersonaError(f"a persona needs a prompt{where}; write what the assistant should be and do")
    return prompt


def _record(row: tuple[Any, ...]) -> PersonaRecord:
    persona_id, name, prompt, bundled, created_at, updated_at = row
    return PersonaRecord(
        id=persona_id, name=name, prompt=prompt, bundled=bool(bundled), created_at=created_at, updated_at=updated_at
    )
