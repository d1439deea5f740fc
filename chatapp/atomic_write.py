"""Writing a user's file so that a crash or a full disk never leaves half of it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from chatapp.errors import ChatappError


def write_text_atomically(path: Path, text: str, *, what: str, error: type[ChatappError] = ChatappError) -> Path:
    """Write `text` to a temporary file beside `path`, sync it, then rename it over `path`.

    `what` names the file for the one-line `error` raised when it cannot be written.
    """
    folder = path.parent
    try:
        is_folder, folder_exists = path.is_dir(), folder.is_dir()
    except OSError as problem:
        raise error(f"cannot write {what} to {path} ({problem.strerror}); choose a folder you can write to") from None
    if is_folder:
        raise error(f"cannot write {what} to {path}: it is a folder; give a file name inside it")
    if not folder_exists:
        raise error(f"cannot write {what} to {path}: folder {folder} does not exist; create it or choose another")
    try:
        descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as problem:
        raise error(
            f"cannot write {what} to {path}: cannot write in {folder} ({problem.strerror}); choose a folder you can write to"
        ) from None
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as problem:
        Path(temporary).unlink(missing_ok=True)
        raise error(f"cannot write {what} to {path} ({problem.strerror}); check free space or choose another path") from None
    return path
