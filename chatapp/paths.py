"""Where chatapp keeps what it writes.

Everything lives under one data folder so that `--data-dir` (or `CHATAPP_HOME`) moves all
of it at once. The folder holds prompts, documents and KV states, so it is private (0700).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from chatapp.errors import ChatappError, DataDirError

ENV_HOME = "CHATAPP_HOME"
PRIVATE_DIR_MODE = 0o700


@dataclass(frozen=True)
class DataPaths:
    """The layout of the data folder."""

    root: Path

    @property
    def config_file(self) -> Path:
        return self.root / "config.toml"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    def private_dir(self, path: Path) -> Path:
        """Create `path` (0700) if it is missing and return it."""
        ensure_private_dir(path)
        return path


def resolve_data_dir(cli_value: str | os.PathLike[str] | None = None) -> Path:
    """The data folder: the command-line value, else $CHATAPP_HOME, else the platform default."""
    if cli_value:
        return Path(cli_value).expanduser()
    env_value = os.environ.get(ENV_HOME)
    if env_value:
        return Path(env_value).expanduser()
    return Path(platformdirs.user_data_dir("chatapp", appauthor=False))


def ensure_private_dir(path: Path) -> None:
    """Create `path` and its missing parents with mode 0700; fail with a clear message."""
    try:
        path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    except OSError as error:
        raise DataDirError(
            f"cannot create data folder {path}: {error.strerror}; choose another with --data-dir or ${ENV_HOME}"
        ) from None
    if not path.is_dir():
        raise DataDirError(f"data folder {path} is not a folder; choose another with --data-dir")
    if not os.access(path, os.W_OK | os.X_OK):
        raise DataDirError(f"data folder {path} is not writable; fix its permissions or choose another with --data-dir")
    if path.stat().st_mode & 0o077:
        # What is stored here reveals what the user typed. A folder that is not ours to change
        # (another owner) stays as it is: the files inside are still created 0600.
        with contextlib.suppress(OSError):
            path.chmod(PRIVATE_DIR_MODE)


def open_data_paths(cli_value: str | os.PathLike[str] | None = None) -> DataPaths:
    """Resolve the data folder, create it privately and return its layout."""
    root = resolve_data_dir(cli_value)
    ensure_private_dir(root)
    return DataPaths(root)


def user_path(text: str) -> Path:
    """A path typed by the user (`~` expanded); ChatappError when it cannot be one."""
    text = text.strip()
    if not text:
        raise ChatappError("no path given; type the path of a file")
    try:
        return Path(text).expanduser()
    except (RuntimeError, ValueError) as error:
        raise ChatappError(f"cannot use the path {text!r} ({error}); type a full path") from None
