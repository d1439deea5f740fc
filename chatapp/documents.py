"""Reading documents (.txt, .md, .pdf) into text for a prompt.

The text is normalised (newlines, trailing spaces) so that the same file always yields
the same tokens, which is what lets every question about it reuse its cached KV.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from chatapp.errors import DocumentError

TEXT_SUFFIXES = {".txt", ".md", ".markdown", ".text", ""}
PDF_SUFFIX = ".pdf"
SUPPORTED = ".txt, .md or .pdf"


@dataclass(frozen=True)
class Document:
    """A document's name (for the prompt) and its normalised text."""

    name: str
    text: str


def normalise_text(text: str) -> str:
    """One newline convention, no trailing spaces, no leading or trailing blank lines."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n")


def _read_text_file(path: Path) -> str:
    data = path.read_bytes()
    if b"\x00" in data:
        raise DocumentError(f"document {path} looks binary (it contains NUL bytes); use a {SUPPORTED} file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise DocumentError(
            f"document {path} is not UTF-8 text (bad byte at offset {error.start}); convert it to UTF-8"
        ) from None


def _read_pdf_file(path: Path) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    # pypdf logs every recoverable oddity of a PDF; they are not the user's problem.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = PdfReader(path)
        if reader.is_encrypted:
            raise DocumentError(f"PDF {path} is encrypted; save an unencrypted copy first")
        pages = [page.extract_text() or "" for page in reader.pages]
    except DocumentError:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise DocumentError(f"PDF {path} cannot be read ({error}); is it a complete PDF file?") from None
    text = "\n\n".join(page.strip() for page in pages)
    if not text.strip():
        raise DocumentError(f"PDF {path} has no text layer (a scan?); run OCR on it or use a text file")
    return text


def load_document(path: Path) -> Document:
    """Read a .txt, .md or .pdf file; raise DocumentError with the fix when that fails."""
    path = path.expanduser()
    if not path.exists():
        raise DocumentError(f"document {path} does not exist; check the path")
    if path.is_dir():
        raise DocumentError(f"document {path} is a folder; pass a {SUPPORTED} file")
    suffix = path.suffix.lower()
    try:
        if suffix == PDF_SUFFIX:
            text = _read_pdf_file(path)
        elif suffix in TEXT_SUFFIXES:
            text = _read_text_file(path)
        else:
            raise DocumentError(f"document {path} has an unsupported type '{suffix}'; use a {SUPPORTED} file")
    except PermissionError:
        raise DocumentError(f"document {path} is not readable; fix its permissions") from None
    except OSError as error:
        raise DocumentError(f"cannot read document {path}: {error.strerror}") from None
    text = normalise_text(text)
    if not text:
        raise DocumentError(f"document {path} is empty; pick a file with some text")
    return Document(name=path.name, text=text)
