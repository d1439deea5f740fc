"""Reading documents, and the one-line errors for every way that fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.documents import load_document
from chatapp.errors import DocumentError
from tests.pdf_factory import write_pdf


def test_text_is_normalised_so_the_same_content_gives_the_same_prompt(tmp_path: Path) -> None:
    unix = tmp_path / "a.txt"
    windows = tmp_path / "b.md"
    unix.write_text("Title\n\nBody line  \n", encoding="utf-8")
    windows.write_bytes(b"\xef\xbb\xbfTitle\r\n\r\nBody line\r\n\r\n")
    assert load_document(unix).text == load_document(windows).text == "Title\n\nBody line"
    assert load_document(windows).name == "b.md"


def test_pdf_text_is_extracted(tmp_path: Path) -> None:
    document = load_document(write_pdf(tmp_path / "report.pdf", ["Quarterly report", "Revenue grew"]))
    assert "Quarterly report" in document.text
    assert "Revenue grew" in document.text


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.txt", b"  \n\n", "is empty"),
        ("binary.txt", b"\x89PNG\r\n\x1a\n\x00\x00", "looks binary"),
        ("latin1.txt", "caf\u00e9".encode("latin-1"), "not UTF-8"),
        ("sheet.xlsx", b"data", "unsupported type"),
        ("broken.pdf", b"%PDF-1.4 this is not really a pdf", "cannot be read"),
    ],
)
def test_bad_documents_get_one_clear_line(tmp_path: Path, name: str, content: bytes, message: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DocumentError, match=message) as caught:
        load_document(path)
    assert "\n" not in str(caught.value)
    assert str(path) in str(caught.value)


def test_pdf_without_text_layer(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match="no text layer"):
        load_document(write_pdf(tmp_path / "scan.pdf", []))


def test_missing_and_folder_paths(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match="does not exist"):
        load_document(tmp_path / "nope.txt")
    with pytest.raises(DocumentError, match="is a folder"):
        load_document(tmp_path)
