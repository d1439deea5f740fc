"""Writing a user's file so that a crash or a full disk never leaves half of it."""

from __future__ import annotations

from pathlib import Path

from cache.atomic_file import replace_atomically
from chatapp.errors import ChatappError


def write_text_atomically(path: Path, text: str, *, what: str, error: type[ChatappError] = ChatappError) -> Path:
    """Write a file the user asked for (an export, a persona) in one step, durably, mode 0600.

    `what` names the file for the one-line `error` raised when it cannot be written. What a
    conversation holds is private, so the file is the user's alone until they share it.
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
        replace_atomically(path, text)
    except OSError as problem:
        raise error(
            f"cannot write {what} to {path} ({problem.strerror}); check free space and that you can write "
            f"in {folder}, or choose another path"
        ) from None
    return path
