"""What the document picker offers: attachable files, typed-path completion, the typed path's check."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.documents import ATTACHABLE_SUFFIXES
from chatapp.errors import ChatappError
from chatapp.services.document_files import complete_path, document_path, is_shown, typed_folder


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for name in ("notes.txt", "notebook.md", "Notices.pdf", "README", "photo.png", ".hidden.md"):
        (tmp_path / name).write_text("text", encoding="utf-8")
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "only.md").write_text("text", encoding="utf-8")
    (tmp_path / ".config").mkdir()
    return tmp_path


def test_the_suffixes_are_the_readers() -> None:
    assert {".txt", ".md", ".pdf"} <= ATTACHABLE_SUFFIXES
    assert ".png" not in ATTACHABLE_SUFFIXES


def test_shown_entries(folder: Path) -> None:
    shown = sorted(path.name for path in folder.iterdir() if is_shown(path))
    assert shown == ["Notices.pdf", "README", "nested", "notebook.md", "notes.txt"]
    assert is_shown(folder / ".hidden.md", hidden=True)
    assert is_shown(folder / "NOTES.TXT")  # the suffix in any case


@pytest.mark.parametrize(
    ("typed", "completion"),
    [
        ("no", "note"),  # the common beginning of notebook.md and notes.txt (Notices.pdf differs in case)
        ("note", "notebook.md"),  # nothing longer in common: the first by name
        ("notes", "notes.txt"),
        ("nes", "nested/"),  # folders end in a slash
        ("nested/", "nested/only.md"),  # a lone entry after a slash
        ("nested/o", "nested/only.md"),
        ("Noti", "Notices.pdf"),
        ("noti", "Notices.pdf"),  # a case mismatch when nothing matches exactly
        (".h", ".hidden.md"),
        ("ph", None),  # not attachable
        ("x", None),
        ("notes.txt", None),  # already whole
        ("missing/n", None),
    ],
)
def test_completion(folder: Path, typed: str, completion: str | None) -> None:
    assert complete_path(typed, folder) == completion
    absolute = complete_path(f"{folder}/{typed}", Path("/elsewhere"))
    assert absolute == (None if completion is None else f"{folder}/{completion}")


def test_completion_after_a_slash_waits_for_a_letter_when_there_are_several(folder: Path) -> None:
    assert complete_path(f"{folder}/", folder) is None


def test_completion_keeps_the_tilde(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(folder))
    assert complete_path("~", folder) == "~/"
    assert complete_path("~/nested/o", Path("/elsewhere")) == "~/nested/only.md"


def test_typed_paths(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(folder))
    assert document_path("notes.txt", folder) == folder / "notes.txt"
    assert document_path("~/nested/only.md", Path("/elsewhere")) == folder / "nested" / "only.md"
    assert typed_folder("nested/", folder) == (folder / "nested").resolve()
    assert typed_folder("notes.txt", folder) is None
    for typed, message in [
        ("", "no path given"),
        ("photo.png", "unsupported type '.png'"),
        ("nested", "is a folder"),
        ("gone.md", "does not exist"),
        ("bad\0name.md", "does not exist|cannot use the path"),  # which one depends on the Python version
    ]:
        with pytest.raises(ChatappError, match=message):
            document_path(typed, folder)


def test_a_whole_path_typed_after_the_folder_starts_over(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The field starts with a folder: typing an absolute or home path after it must not be appended to it."""
    monkeypatch.setenv("HOME", str(folder / "nested"))
    elsewhere = "/elsewhere/"
    assert document_path(f"{elsewhere}{folder}/notes.txt", Path(elsewhere)) == folder / "notes.txt"
    assert document_path(f"{elsewhere}~/only.md", Path(elsewhere)) == folder / "nested" / "only.md"
    assert complete_path(f"{elsewhere}{folder}/nested/o", Path(elsewhere)) == f"{elsewhere}{folder}/nested/only.md"
    assert typed_folder(f"{elsewhere}{folder}/nested/", Path(elsewhere)) == (folder / "nested").resolve()
    (folder / "~draft.md").write_text("text", encoding="utf-8")
    assert document_path(f"{folder}/~draft.md", folder) == folder / "~draft.md", "a name that starts with ~"
    (folder / "nested" / "~draft.md").write_text("text", encoding="utf-8")
    assert document_path(f"{elsewhere}~/~draft.md", Path(elsewhere)) == folder / "nested" / "~draft.md"
    assert document_path("/~/only.md", Path("/")) == folder / "nested" / "only.md", "the field at the root folder"
    assert complete_path(f"{elsewhere}~", Path(elsewhere)) == f"{elsewhere}~/"
