"""Personas: seeding the bundled ones once, name rules, and the Markdown file format."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from chatapp.errors import PersonaError
from chatapp.store.database import open_database
from chatapp.store.personas import (
    PersonaStore,
    PersonaText,
    bundled_personas_dir,
    parse_persona_text,
)


@pytest.fixture
def store(connection: sqlite3.Connection) -> PersonaStore:
    return PersonaStore(connection, None)


@pytest.fixture
def bundled(tmp_path: Path) -> Path:
    folder = tmp_path / "bundled"
    folder.mkdir()
    (folder / "b-second.md").write_text("# Pirate\n\nTalk like a pirate.\n", encoding="utf-8")
    (folder / "a_first.md").write_text("Answer in haiku.\n", encoding="utf-8")
    (folder / "notes.txt").write_text("not a persona", encoding="utf-8")
    return folder


def test_bundled_personas_are_seeded_from_markdown_files(connection: sqlite3.Connection, bundled: Path) -> None:
    personas = PersonaStore(connection, bundled).list()
    assert [(p.name, p.prompt, p.bundled) for p in personas] == [
        ("A first", "Answer in haiku.", True),
        ("Pirate", "Talk like a pirate.", True),
    ]


def test_a_deleted_bundled_persona_stays_deleted_after_reopening(db_path: Path, bundled: Path) -> None:
    connection = open_database(db_path)
    store = PersonaStore(connection, bundled)
    store.delete(store.get_by_name("Pirate").id)
    connection.close()

    reopened = open_database(db_path)
    try:
        assert [p.name for p in PersonaStore(reopened, bundled).list()] == ["A first"]
        # A persona shipped later is still seeded, once.
        (bundled / "c.md").write_text("# Poet\nRhyme.", encoding="utf-8")
        PersonaStore(reopened, bundled)
        assert [p.name for p in PersonaStore(reopened, bundled).list()] == ["A first", "Poet"]
    finally:
        reopened.close()


def test_seeding_keeps_a_users_persona_with_the_same_name(connection: sqlite3.Connection, bundled: Path) -> None:
    PersonaStore(connection, None).create("pirate", "My own pirate.")
    store = PersonaStore(connection, bundled)
    assert [(p.name, p.prompt, p.bundled) for p in store.list() if p.name.casefold() == "pirate"] == [
        ("pirate", "My own pirate.", False)
    ]


def test_a_missing_bundled_folder_seeds_nothing(connection: sqlite3.Connection, tmp_path: Path) -> None:
    assert PersonaStore(connection, tmp_path / "nowhere").list() == []


def test_the_shipped_personas_are_the_four_useful_ones(connection: sqlite3.Connection) -> None:
    assert bundled_personas_dir().is_dir()
    personas = PersonaStore(connection, bundled_personas_dir()).list()
    assert [p.name for p in personas] == ["Code reviewer", "Concise assistant", "Document analyst", "Translator"]
    for persona in personas:
        assert 60 <= len(persona.prompt.split()) <= 150, persona.name
    analyst = next(p for p in personas if p.name == "Document analyst")
    assert "quot" in analyst.prompt
    assert "does not say" in analyst.prompt


def test_the_file_format_uses_a_heading_or_the_file_name() -> None:
    assert parse_persona_text("# Sage \n\n  Be wise.\n\n", "ignored") == PersonaText("Sage", "Be wise.")
    heading_less = parse_persona_text("Be brief.\n# Not a name\n", "my_short-helper")
    assert (heading_less.name, heading_less.prompt) == ("My short helper", "Be brief.\n# Not a name")
    assert parse_persona_text("## Sub heading\nText", "x").name == "X"
    assert parse_persona_text("\ufeff# Bom\r\nText\r\n", "x") == PersonaText("Bom", "Text")


def test_export_then_import_round_trips(store: PersonaStore, tmp_path: Path) -> None:
    original = store.create("Code Reviewer+", "Review carefully.\n\n- bugs first\n- then style")
    exported = store.export(original.id, tmp_path)
    assert exported == tmp_path / "code-reviewer.md"
    expected = "# Code Reviewer+\n\nReview carefully.\n\n- bugs first\n- then style\n"
    assert exported.read_text(encoding="utf-8") == expected

    other_connection = open_database(tmp_path / "other.db")
    try:
        imported = PersonaStore(other_connection, None).import_file(exported)
        assert (imported.name, imported.prompt, imported.bundled) == (original.name, original.prompt, False)
    finally:
        other_connection.close()

    named = store.export(original.id, tmp_path / "chosen name.md")
    assert named.name == "chosen name.md"
    assert named.read_text(encoding="utf-8") == exported.read_text(encoding="utf-8")


def test_importing_a_taken_name_adds_a_suffix(store: PersonaStore, tmp_path: Path) -> None:
    store.create("Sage", "Be wise.")
    file = tmp_path / "sage.md"
    file.write_text("# SAGE\n\nBe wiser.", encoding="utf-8")
    assert store.import_file(file).name == "SAGE (imported)"
    assert store.import_file(file).name == "SAGE (imported 2)"
    names = [p.name for p in store.list()]
    assert sorted(names) == sorted(["Sage", "SAGE (imported)", "SAGE (imported 2)"])
    assert names == sorted(names, key=str.casefold)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist; check the path"),
        (b"", "is empty"),
        (b"  \n\n ", "is empty"),
        (b"# Only a name\n\n", "only a '# Name' line"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "looks binary"),
        ("caf\u00e9".encode("latin-1"), "not UTF-8"),
        (b"# " + b"n" * 81 + b"\nprompt", "shorten it to 80"),
    ],
)
def test_bad_persona_files_get_one_clear_line(
    store: PersonaStore, tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "persona.md"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(PersonaError) as raised:
        store.import_file(path)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)
    assert store.list() == []


def test_a_folder_is_not_a_persona_file(store: PersonaStore, tmp_path: Path) -> None:
    with pytest.raises(PersonaError, match="is a folder"):
        store.import_file(tmp_path)


def test_names_are_stripped_bounded_and_unique_ignoring_case(store: PersonaStore) -> None:
    sage = store.create("  Sage  ", "Be wise.")
    assert sage.name == "Sage"
    assert store.create("x" * 80, "ok").name == "x" * 80
    with pytest.raises(PersonaError, match="already exists"):
        store.create("SAGE", "Another.")
    with pytest.raises(PersonaError, match="needs a name"):
        store.create("   ", "Prompt.")
    with pytest.raises(PersonaError, match="shorten it to 80"):
        store.create("y" * 81, "Prompt.")
    with pytest.raises(PersonaError, match="control characters"):
        store.create("Two\nlines", "Prompt.")
    with pytest.raises(PersonaError, match="needs a prompt"):
        store.create("Empty", "  \n ")
    assert len(store.list()) == 2


def test_update_renames_and_changes_the_prompt(store: PersonaStore) -> None:
    sage = store.create("Sage", "Be wise.")
    store.create("Jester", "Be funny.")
    renamed = store.update(sage.id, name="SAGE")
    assert renamed.name == "SAGE"
    assert renamed.prompt == "Be wise."
    assert store.update(sage.id, prompt=" Be wiser. ").prompt == "Be wiser."
    assert store.get_by_name("sage").prompt == "Be wiser."
    with pytest.raises(PersonaError, match="already exists"):
        store.update(sage.id, name="jester")
    with pytest.raises(PersonaError, match="needs a prompt"):
        store.update(sage.id, prompt="")
    assert store.get(sage.id).name == "SAGE"


def test_duplicates_are_numbered(store: PersonaStore) -> None:
    sage = store.create("Sage", "Be wise.")
    first = store.duplicate(sage.id)
    second = store.duplicate(sage.id)
    assert (first.name, second.name) == ("Sage (copy)", "Sage (copy 2)")
    assert first.prompt == "Be wise."
    assert not first.bundled
    long = store.create("z" * 80, "Long.")
    assert len(store.duplicate(long.id).name) == 80


def test_unknown_personas_say_where_to_look(store: PersonaStore) -> None:
    with pytest.raises(PersonaError, match=r"no persona named 'Ghost'; see the persona list \(F2\) or create it"):
        store.get_by_name(" Ghost ")
    with pytest.raises(PersonaError, match="persona 7 does not exist"):
        store.get(7)
    with pytest.raises(PersonaError, match="persona 7 does not exist"):
        store.delete(7)


def test_export_to_a_missing_folder_is_one_line(store: PersonaStore, tmp_path: Path) -> None:
    sage = store.create("Sage", "Be wise.")
    with pytest.raises(PersonaError, match="does not exist; create it or choose another"):
        store.export(sage.id, tmp_path / "missing" / "sage.md")
