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
ATTACHABLE_SUFFIXES = frozenset({*TEXT_SUFFIXES, PDF_SUFFIX})  # what load_document reads (lower case)


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


def check_document_path(path: Path) -> Path:
    """The path (`~` expanded) when it names an existing file of a type `load_document` reads.

    Only the name and the file's kind are looked at, not its text: cheap enough for a
    dialog to check a typed path. DocumentError names the problem and the fix.
    """
    path = path.expanduser()
    try:
        exists, is_dir = path.exists(), path.is_dir()
    except OSError as error:
        raise DocumentError(f"cannot read document {path}: {error.strerror}") from None
    except ValueError:  # a NUL byte in the path
        raise DocumentError(f"cannot use the path {str(path)!r}; type the path of a {SUPPORTED} file") from None
    if not exists:
        raise DocumentError(f"document {path} does not exist; check the path")
    if is_dir:
        raise DocumentError(f"document {path} is a folder; pass a {SUPPORTED} file")
    suffix = path.suffix.lower()
    if suffix not in ATTACHABLE_SUFFIXES:
        raise DocumentError(f"document {path} has an unsupported type '{suffix}'; use a {SUPPORTED} file")
    return path


def load_document(path: Path) -> Document:
    """Read a .txt, .md or .pdf file; raise DocumentError with the fix when that fails."""
    path = check_document_path(path)
    try:
        if path.suffix.lower() == PDF_SUFFIX:
            text = _read_pdf_file(path)
        else:
            text = _read_text_file(path)
    except PermissionError:
        raise DocumentError(f"document {path} is not readable; fix its permissions") from None
    except OSError as error:
        raise DocumentError(f"cannot read document {path}: {error.strerror}") from None
    text = normalise_text(text)
    if not text:
        raise DocumentError(f"document {path} is empty; pick a file with some text")
    return Document(name=path.name, text=text)
