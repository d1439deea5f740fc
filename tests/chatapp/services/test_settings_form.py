"""The settings screen's backend: fields, form text <-> Settings, and saving config.toml."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from chatapp.errors import SettingsError
from chatapp.services.settings_form import (
    RESTART_FIELDS,
    SettingField,
    changed_restart_fields,
    field_errors,
    format_value,
    parse_values,
    save_settings,
    setting_fields,
)
from chatapp.settings import Settings, load_settings

ODD_PATH = Path('/models/it\'s "quoted"\\back\\slash/naïve 模型 🦙\tx\x01y.gguf')

# A non-default value for every field, so every kind goes through the round trip.
EVERYTHING = Settings(
    model=ODD_PATH,
    model_folders="/srv/models:/data/gguf",
    context_cap=4096,
    sequences=2,
    n_gpu_layers=0,
    threads=3,
    flash_attention="on",
    kv_type="q8_0",
    batch_answers=False,
    prompt_batches="grid",
    temperature=0.0,
    top_p=0.5,
    max_tokens=1024,
    seed=0,
    cache_block_size=128,
    cache_ram_mib=0,
    cache_disk_mib=1,
    cache_ttl_days=0.25,
    cache_eviction="lru",
    cache_checks=3,
    swa_full=True,
    checkpoint_every_blocks=4,
    backend="http://127.0.0.1:9",
    backend_key="key",
    backend_model="big",
    warm_ahead=False,
)


def form_of(settings: Settings) -> dict[str, str]:
    return {field.name: format_value(field, getattr(settings, field.name)) for field in setting_fields()}


def field(name: str) -> SettingField:
    return next(item for item in setting_fields() if item.name == name)


def leftovers(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if path.name != "config.toml")


# --- fields -------------------------------------------------------------------------------


def test_fields_follow_the_settings_model() -> None:
    fields = setting_fields()
    assert [item.name for item in fields] == list(Settings.model_fields)
    assert all(item.default == Settings.model_fields[item.name].default for item in fields)
    assert all(item.description and "\n" not in item.description for item in fields)
    assert len({item.label for item in fields}) == len(fields)
    assert set(Settings.model_fields) >= RESTART_FIELDS


def test_labels_kinds_and_restart_flags() -> None:
    assert field("context_cap").label == "Context cap"
    assert field("n_gpu_layers").label == "GPU layers"
    assert field("temperature").description == Settings.model_fields["temperature"].description
    assert field("top_p").description  # pydantic has none; a sensible one is supplied
    kinds = {item.name: item.kind for item in setting_fields()}
    assert kinds["model"] == "path"
    assert kinds["threads"] == "optional-int"
    assert kinds["seed"] == "optional-int"
    assert kinds["context_cap"] == "int"
    assert kinds["temperature"] == "float"
    assert kinds["batch_answers"] == "bool"
    assert kinds["flash_attention"] == "choice"
    assert kinds["cache_eviction"] == "choice"
    assert kinds["prompt_batches"] == "choice"
    assert kinds["kv_type"] == "choice"
    restart = {item.name for item in setting_fields() if item.restart_needed}
    assert restart == {
        "model", "context_cap", "sequences", "n_gpu_layers", "threads", "flash_attention", "kv_type", "batch_answers",
        "prompt_batches", "cache_block_size", "cache_ram_mib", "cache_disk_mib", "cache_ttl_days", "cache_eviction",
        "cache_checks", "swa_full",
        "backend", "backend_key", "backend_model",
        "checkpoint_every_blocks",
    }  # fmt: skip
    assert not restart & {"temperature", "top_p", "max_tokens", "seed"}


def test_format_value() -> None:
    assert format_value(field("model"), None) == ""
    assert format_value(field("model"), Path("/m/x.gguf")) == "/m/x.gguf"
    assert format_value(field("batch_answers"), True) == "true"
    assert format_value(field("batch_answers"), False) == "false"
    assert format_value(field("threads"), None) == ""
    assert format_value(field("context_cap"), 8192) == "8192"
    assert format_value(field("temperature"), 0.7) == "0.7"


# --- parsing ------------------------------------------------------------------------------


def test_form_round_trip_of_every_kind() -> None:
    assert parse_values(form_of(EVERYTHING)) == EVERYTHING
    assert parse_values(form_of(Settings())) == Settings()


def test_empty_text_means_the_default() -> None:
    texts = {name: "" for name in Settings.model_fields}
    assert parse_values(texts) == Settings()
    assert parse_values({"model": "   ", "threads": "", "seed": " ", "context_cap": ""}) == Settings()
    assert parse_values({}) == Settings()
    assert parse_values({"threads": " 6 ", "model": " /m/x.gguf "}) == Settings(threads=6, model=Path("/m/x.gguf"))


@pytest.mark.parametrize(
    ("text", "value"),
    [("true", True), ("TRUE", True), ("Yes", True), ("on", True), ("1", True),
     ("false", False), ("False", False), ("NO", False), ("off", False), ("0", False)],
)  # fmt: skip
def test_bool_words(text: str, value: bool) -> None:
    assert parse_values({"batch_answers": text}).batch_answers is value


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        ({"temperature": "9"}, "Temperature: Input should be less than or equal to 5"),
        ({"context_cap": "big"}, "Context cap: Input should be a valid integer"),
        ({"context_cap": "100"}, "Context cap: Input should be greater than or equal to 256"),
        ({"top_p": "0"}, "Top p: Input should be greater than 0"),
        ({"threads": "0"}, "Threads: Input should be greater than or equal to 1"),
        ({"seed": "-1"}, "Seed: Input should be greater than or equal to 0"),
        ({"cache_ttl_days": "soon"}, "Cache TTL days: Input should be a valid number"),
        ({"batch_answers": "maybe"}, "Batch answers: Input should be true or false"),
        ({"flash_attention": "true"}, "Flash attention: Input should be 'auto', 'on' or 'off'"),
    ],
)
def test_bad_values_give_the_label_and_the_reason(texts: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        parse_values(texts)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)
    assert list(field_errors(texts)) == list(texts)


def test_every_bad_field_is_reported_together() -> None:
    texts = form_of(Settings()) | {"max_tokens": "0", "batch_answers": "perhaps", "temperature": "hot"}
    errors = field_errors(texts)
    assert list(errors) == ["batch_answers", "temperature", "max_tokens"]  # form order
    assert errors["temperature"].startswith("Input should be a valid number")
    assert errors["max_tokens"] == "Input should be greater than or equal to 1"
    assert errors["batch_answers"].startswith("Input should be true or false")
    with pytest.raises(SettingsError, match=r"^Batch answers: .* \(and 2 more problems\)$"):
        parse_values(texts)
    assert field_errors(form_of(EVERYTHING)) == {}


def test_unknown_keys_are_impossible_by_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="temprature"):
        parse_values({"temprature": "0.5"})
    with pytest.raises(ValueError, match="temprature"):
        field_errors({"temprature": "0.5"})
    config = tmp_path / "config.toml"
    save_settings(config, EVERYTHING)
    assert set(tomllib.loads(config.read_text(encoding="utf-8"))) == set(Settings.model_fields)


# --- saving -------------------------------------------------------------------------------


def test_file_round_trip_of_every_kind(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    save_settings(config, EVERYTHING)
    assert load_settings(config) == EVERYTHING
    assert load_settings(config).model == ODD_PATH
    text = config.read_text(encoding="utf-8")
    assert text.startswith("# ")
    assert "naïve 模型 🦙" in text
    assert leftovers(tmp_path) == []


def test_infinite_ttl_round_trips(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    settings = parse_values({"cache_ttl_days": "inf"})
    save_settings(config, settings)
    assert load_settings(config) == settings


def test_defaults_are_not_written(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    save_settings(config, Settings())
    assert tomllib.loads(config.read_text(encoding="utf-8")) == {}
    assert load_settings(config) == Settings()
    save_settings(config, Settings(temperature=0.2, context_cap=8192, seed=None))
    assert tomllib.loads(config.read_text(encoding="utf-8")) == {"temperature": 0.2}


def test_rewrites_the_old_file(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("# my notes\nsequences = 8\n", encoding="utf-8")
    save_settings(config, Settings(max_tokens=64))
    assert tomllib.loads(config.read_text(encoding="utf-8")) == {"max_tokens": 64}


def test_file_mode_is_0600(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("sequences = 8\n", encoding="utf-8")
    config.chmod(0o644)
    save_settings(config, EVERYTHING)
    assert stat.S_IMODE(config.stat().st_mode) == 0o600


NOBODY = 65534  # root ignores file modes: as root, the write is tried as this user


@contextmanager
def read_only_folder() -> Iterator[Path]:
    """A folder its writer cannot write in, entered as that writer (as "nobody" when the tests run as root)."""
    outer = Path(tempfile.mkdtemp())
    folder = outer / "settings"
    folder.mkdir()
    (folder / "config.toml").write_text("sequences = 8\n", encoding="utf-8")
    as_root = os.geteuid() == 0
    if as_root:
        outer.chmod(0o755)
        for path in (folder, folder / "config.toml"):
            os.chown(path, NOBODY, NOBODY)
    folder.chmod(0o500)
    try:
        if as_root:
            os.seteuid(NOBODY)
        try:
            yield folder
        finally:
            if as_root:
                os.seteuid(0)
    finally:
        folder.chmod(0o700)
        shutil.rmtree(outer)


def test_read_only_folder_leaves_the_old_file() -> None:
    with read_only_folder() as folder:
        config = folder / "config.toml"
        with pytest.raises(SettingsError) as caught:
            save_settings(config, EVERYTHING)
        assert config.read_text(encoding="utf-8") == "sequences = 8\n"
        assert leftovers(folder) == []
    assert str(config) in str(caught.value)
    assert "writable" in str(caught.value)


@pytest.mark.parametrize(
    ("target", "error"),
    [
        ("mkstemp", PermissionError(errno.EACCES, "Permission denied")),  # cannot create in the folder
        ("fsync", OSError(errno.ENOSPC, "No space left on device")),  # disk full while writing
        ("replace", PermissionError(errno.EACCES, "Permission denied")),  # cannot rename into place
    ],
)
def test_io_errors_leave_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, error: OSError
) -> None:
    config = tmp_path / "config.toml"
    config.write_text("sequences = 8\n", encoding="utf-8")

    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(tempfile if target == "mkstemp" else os, target, fail)
    with pytest.raises(SettingsError) as caught:
        save_settings(config, EVERYTHING)
    message = str(caught.value)
    assert str(config) in message
    assert error.strerror is not None
    assert error.strerror in message
    assert "\n" not in message
    assert config.read_text(encoding="utf-8") == "sequences = 8\n"
    assert leftovers(tmp_path) == []


def test_missing_folder_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "gone" / "config.toml"
    with pytest.raises(SettingsError, match=r"cannot save settings to .*config.toml: No such file"):
        save_settings(config, EVERYTHING)


def test_invalid_settings_leave_the_old_file(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("sequences = 8\n", encoding="utf-8")
    bad = Settings.model_construct(temperature=99.0)  # skips validation
    with pytest.raises(SettingsError, match="temperature: Input should be less than or equal to 5") as caught:
        save_settings(config, bad)
    assert str(config) in str(caught.value)
    assert "\n" not in str(caught.value)
    assert config.read_text(encoding="utf-8") == "sequences = 8\n"
    assert leftovers(tmp_path) == []


def test_unencodable_path_is_refused_before_writing(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("sequences = 8\n", encoding="utf-8")
    with pytest.raises(SettingsError, match=r"^Model: cannot save this value"):
        save_settings(config, Settings(model=Path("/models/\udcff.gguf")))
    assert config.read_text(encoding="utf-8") == "sequences = 8\n"
    assert leftovers(tmp_path) == []


# --- restart ------------------------------------------------------------------------------


def test_changed_restart_fields() -> None:
    old = Settings()
    assert changed_restart_fields(old, old) == []
    assert changed_restart_fields(old, Settings(temperature=0.1, top_p=0.5, max_tokens=9, seed=1)) == []
    new = Settings(context_cap=4096, cache_ram_mib=1, temperature=0.1, model=Path("/m/x.gguf"))
    assert changed_restart_fields(old, new) == ["Model", "Context cap", "Cache RAM MiB"]
    assert len(changed_restart_fields(old, EVERYTHING)) == len(
        [item for item in setting_fields() if item.restart_needed]
    )
