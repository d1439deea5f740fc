"""The files a document picker offers: which can be attached, where to start, typed-path completion.

The picker shows folders and the files `chatapp.documents` reads (its suffixes, not a
copy of them); a typed path is checked here by its name and kind before the slow read,
so the dialog can say what is wrong while it is still open.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from chatapp.documents import ATTACHABLE_SUFFIXES, SUPPORTED, check_document_path
from chatapp.errors import ChatappError
from chatapp.paths import user_path

if TYPE_CHECKING:
    from chatapp.services.chat_service import ChatService

__all__ = [
    "ATTACHABLE_SUFFIXES",
    "SUPPORTED",
    "check_document_path",
    "complete_path",
    "document_path",
    "is_shown",
    "start_folder",
    "typed_folder",
]


# A home folder typed after the field's folder ("/work/docs/~/notes.md"), not a name that begins with "~".
_HOME_TYPED = re.compile(r"/~(?=/|$)")


def is_shown(path: Path, *, hidden: bool = False) -> bool:
    """Whether a picker lists this entry: a folder or an attachable file; hidden ones only if asked."""
    if path.name.startswith(".") and not hidden:
        return False
    return _is_dir(path) or path.suffix.lower() in ATTACHABLE_SUFFIXES


def typed_path(text: str, base: Path) -> Path:
    """A path typed in the picker: `~` expanded, a relative one taken from `base`.

    The field starts with a folder, so a whole path typed after it starts over where it begins
    ("/work/docs//etc/notes.md", "/work/docs/~/notes.md"), as in Emacs's and GTK's file choosers.
    """
    path = user_path(_started_over(text))
    return path if path.is_absolute() else base / path


def _started_over(text: str) -> str:
    """The part of `text` from the last place a new absolute or home path was typed (all of it if none)."""
    homes = [match.start() for match in _HOME_TYPED.finditer(text)]  # "/~" then "/" or the end, not "/~draft.md"
    root = text.rfind("//")
    start = max(root if root > 0 else -1, homes[-1] if homes else -1)  # a leading "//" is a path of its own
    return text[start + 1 :] if start >= 0 else text


def typed_folder(text: str, base: Path) -> Path | None:
    """The folder a typed path names (resolved), or None when it names none."""
    try:
        folder = typed_path(text, base).resolve()
    except (ChatappError, OSError, RuntimeError, ValueError):
        return None
    return folder if _is_dir(folder) else None


def document_path(text: str, base: Path) -> Path:
    """The file a typed path names; ChatappError naming the problem and the fix if it cannot be attached."""
    return check_document_path(typed_path(text, base))


def start_folder(service: ChatService) -> Path:
    """Where the picker opens: the folder of the last attached document, else the working directory."""
    source = service.conversations.latest_document_source()
    if source:
        folder = Path(source).parent
        if _is_dir(folder):
            return folder
    try:
        return Path.cwd()
    except OSError:  # the working directory was deleted
        return Path.home()


def complete_path(text: str, base: Path) -> str | None:
    """`text` with its last part completed to a folder (ending in `/`) or an attachable file; None if none fits.

    Several candidates complete to their longest common beginning, then to the first by
    name. A letter-case mismatch completes when nothing matches exactly (the completion
    then carries the name's own case). After a `/` with nothing typed, only a lone entry
    is offered. Hidden entries are offered once the typed part starts with a dot.
    """
    if _started_over(text) == "~":
        return text + "/"
    head, slash, partial = text.rpartition("/")
    folder_text = head + slash
    try:
        folder = typed_path(folder_text, base) if folder_text else base
        entries = [entry for entry in folder.iterdir() if is_shown(entry, hidden=partial.startswith("."))]
    except (ChatappError, OSError, ValueError):
        return None
    names = sorted(entry.name + "/" if _is_dir(entry) else entry.name for entry in entries)
    matches = [name for name in names if name.startswith(partial)]
    if not matches:
        matches = [name for name in names if name.casefold().startswith(partial.casefold())]
    if not matches or (not partial and len(matches) > 1):
        return None
    common = os.path.commonprefix(matches)  # noqa: RUF071 (names, not paths: their common letters are the point)
    completion = common if len(common) > len(partial) else matches[0]
    return None if completion == partial else folder_text + completion


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # no permission to look
        return False
