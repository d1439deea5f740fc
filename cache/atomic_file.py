"""Replacing a file so that a crash, a kill or a full disk never leaves half of it.

The one way every part of chatapp writes a file in place (settings, exports, personas, the
fingerprint memo, the cache's lifetime totals): a temporary file beside the target, flushed
and synced, optionally checked, then renamed over the target; with `durable` the folder is
synced too, so the rename itself survives a power cut. It lives in the cache library because
the cache may not import the app; the app's user-facing wrapper is chatapp/atomic_write.py.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

PRIVATE_FILE = 0o600


def replace_atomically(
    path: Path,
    data: str | bytes,
    *,
    mode: int = PRIVATE_FILE,
    durable: bool = True,
    check: Callable[[Path], None] | None = None,
) -> None:
    """Write `data` (text as UTF-8) to `path` in one step; on any error `path` is left as it was.

    `check` is called with the finished temporary file before the rename and may raise to stop
    it. Raises OSError (and whatever `check` raises); the temporary file never stays behind.
    """
    folder = path.parent
    descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        if check is not None:
            check(Path(temporary))
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    if durable:
        sync_folder(folder)


def sync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable where the platform allows it; best effort."""
    with contextlib.suppress(OSError, AttributeError):
        descriptor = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
