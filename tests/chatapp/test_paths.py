"""The data folder: where it is, and that it is private."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from chatapp.errors import DataDirError
from chatapp.paths import open_data_paths, resolve_data_dir


def test_command_line_beats_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATAPP_HOME", str(tmp_path / "env"))
    assert resolve_data_dir(str(tmp_path / "cli")) == tmp_path / "cli"
    assert resolve_data_dir(None) == tmp_path / "env"
    monkeypatch.delenv("CHATAPP_HOME")
    assert "chatapp" in str(resolve_data_dir(None))


def test_data_folder_is_created_private(tmp_path: Path) -> None:
    paths = open_data_paths(tmp_path / "deep" / "data")
    assert stat.S_IMODE(paths.root.stat().st_mode) == 0o700
    cache = paths.private_dir(paths.cache_dir)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700


def test_an_existing_open_data_folder_is_made_private(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    paths = open_data_paths(folder)
    assert stat.S_IMODE(paths.root.stat().st_mode) == 0o700


def test_a_file_in_the_way_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "data"
    blocker.write_text("not a folder")
    with pytest.raises(DataDirError, match="--data-dir"):
        open_data_paths(blocker)
