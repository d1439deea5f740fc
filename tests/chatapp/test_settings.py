"""Settings: defaults, the TOML file, overrides, and pydantic's reasons in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.errors import SettingsError
from chatapp.settings import load_settings


def test_defaults_without_a_file(tmp_path: Path) -> None:
    settings = load_settings(tmp_path / "config.toml")
    assert settings.context_cap == 8192
    assert settings.sequences == 4
    assert settings.model is None


def test_file_values_and_command_line_overrides(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('temperature = 0.2\ncontext_cap = 4096\nmodel = "/models/x.gguf"\n', encoding="utf-8")
    settings = load_settings(config, {"temperature": 0.0, "seed": None})
    assert settings.temperature == 0.0  # the command line wins
    assert settings.context_cap == 4096
    assert settings.model == Path("/models/x.gguf")
    assert settings.seed is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("context_cap = 'big'", "context_cap: Input should be a valid integer"),
        ("max_tokens = -5", "max_tokens: Input should be greater than or equal to 1"),
        ("temprature = 0.5", "temprature: unknown setting"),
        ("context_cap = ", "not valid TOML"),
    ],
)
def test_invalid_files_name_the_key_and_the_reason(tmp_path: Path, content: str, message: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(content, encoding="utf-8")
    with pytest.raises(SettingsError, match=message) as caught:
        load_settings(config)
    assert str(config) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_invalid_command_line_value(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="command line: temperature"):
        load_settings(None, {"temperature": -1.0})
