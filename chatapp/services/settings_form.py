"""The settings screen's backend: field metadata, form text <-> Settings, and saving config.toml.

Everything here is derived from `Settings.model_fields`, so a new setting shows up in the
form, is parsed and is saved without touching this module (unless it has a new type, which
fails loudly in `setting_fields`). Only the set of fields that need a restart is kept by hand.

Saving writes only the values that differ from the defaults, as a small TOML file the user
can read and edit, atomically (temporary file in the same folder, then `os.replace`) with
mode 0600, and it re-reads the temporary file with `load_settings` before it replaces the old
one, so a file that would not load back to the same settings never reaches config.toml.
"""

from __future__ import annotations

import math
import os
import textwrap
import tomllib
import types
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cache.atomic_file import replace_atomically
from chatapp.errors import SettingsError
from chatapp.settings import Settings, describe_validation_error, load_settings

CONFIG_FILE_MODE = 0o600

# Fields that change how the model, the llama.cpp context or the KV cache is opened; they take
# effect after a restart. Every field whose name starts with "cache_" is one too. The rest
# (sampling: temperature, top_p, max_tokens, seed) apply to the next answer.
RESTART_FIELDS = frozenset(
    {
        "model",
        "context_cap",
        "sequences",
        "n_gpu_layers",
        "threads",
        "flash_attention",
        "kv_type",
        "batch_answers",
        "prompt_batches",
        "swa_full",
        "backend",
        "backend_key",
        "backend_model",
        "checkpoint_every_blocks",
    }
)
RESTART_PREFIXES = ("cache_",)

TRUE_WORDS = frozenset({"true", "yes", "on", "1"})
FALSE_WORDS = frozenset({"false", "no", "off", "0"})
BOOL_REASON = "Input should be true or false (or yes/no, on/off, 1/0)"

# Words shown in a label differently from how they are spelt in the field name.
_LABEL_WORDS = {"gpu": "GPU", "ram": "RAM", "mib": "MiB", "ttl": "TTL", "kv": "KV"}
# Leading words dropped from a label ("n_gpu_layers" -> "GPU layers").
_LABEL_DROP_FIRST = frozenset({"n"})
# Descriptions for fields whose pydantic Field has none.
_FALLBACK_DESCRIPTIONS = {
    "top_p": "nucleus sampling: keep the most likely tokens whose probabilities add up to this; 1 keeps all",
}

_HEADER = (
    "# chatapp settings, written by the settings screen: only values that differ from the defaults\n"
    "# are listed; delete a line to go back to its default.\n"
)


@dataclass(frozen=True)
class SettingField:
    """One row of the settings form."""

    name: str
    label: str
    description: str
    kind: str  # "int" | "float" | "bool" | "path" | "optional-int" | "optional-text" | "choice" (one of a few words)
    default: Any
    restart_needed: bool


def _label(name: str) -> str:
    words = name.split("_")
    if len(words) > 1 and words[0] in _LABEL_DROP_FIRST:
        words = words[1:]
    words = [_LABEL_WORDS.get(word, word) for word in words]
    first = words[0]
    words[0] = first if first.isupper() or first in _LABEL_WORDS.values() else first.capitalize()
    return " ".join(words)


def _kind(name: str, annotation: Any) -> str:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal and all(isinstance(arg, str) for arg in args):
        return "choice"
    optional = typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args
    inner = [arg for arg in args if arg is not type(None)] if optional else [annotation]
    if len(inner) == 1:
        base = inner[0]
        if isinstance(base, type) and issubclass(base, Path):
            return "path"
        if base is bool and not optional:
            return "bool"
        if base is str and optional:
            return "optional-text"
        if base is int:
            return "optional-int" if optional else "int"
        if base is float and not optional:
            return "float"
    raise TypeError(
        f"settings form: no editor for {name}: {annotation!r}; teach chatapp.services.settings_form its type"
    )


def _restart_needed(name: str) -> bool:
    return name in RESTART_FIELDS or name.startswith(RESTART_PREFIXES)


@cache
def _fields() -> tuple[SettingField, ...]:
    fields = []
    for name, info in Settings.model_fields.items():
        label = _label(name)
        description = info.description or _FALLBACK_DESCRIPTIONS.get(name) or label
        fields.append(
            SettingField(
                name=name,
                label=label,
                description=" ".join(description.split()),
                kind=_kind(name, info.annotation),
                default=info.default,
                restart_needed=_restart_needed(name),
            )
        )
    return tuple(fields)


def setting_fields() -> list[SettingField]:
    """The form's rows, in the order of `Settings`' fields."""
    return list(_fields())


def _field_by_name() -> dict[str, SettingField]:
    return {field.name: field for field in _fields()}


def format_value(field: SettingField, value: Any) -> str:
    """What the text input for `field` shows for `value` (None is empty)."""
    if value is None:
        return ""
    if field.kind == "bool" or isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _collect(texts: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Form text -> values for `Settings.model_validate`, plus reasons found before pydantic."""
    by_name = _field_by_name()
    unknown = sorted(set(texts) - set(by_name))
    if unknown:
        raise ValueError(f"settings form: unknown field(s) {', '.join(unknown)}")
    values: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name, raw in texts.items():
        field = by_name[name]
        text = raw.strip()
        if not text:
            continue  # the default; None for the optional fields
        if field.kind == "bool":
            word = text.lower()
            if word in TRUE_WORDS:
                values[name] = True
            elif word in FALSE_WORDS:
                values[name] = False
            else:
                errors[name] = BOOL_REASON
        else:
            values[name] = text  # pydantic parses numbers and paths from strings, with its own reasons
    return values, errors


def _reasons(error: ValidationError) -> dict[str, str]:
    reasons: dict[str, str] = {}
    for item in error.errors():
        key = str(item["loc"][0]) if item["loc"] else ""
        reasons.setdefault(key, item["msg"])
    return reasons


def _validate(texts: dict[str, str]) -> tuple[Settings | None, dict[str, str]]:
    values, errors = _collect(texts)
    try:
        settings = Settings.model_validate(values)
    except ValidationError as error:
        for name, reason in _reasons(error).items():
            errors.setdefault(name, reason)
        return None, errors
    return (None, errors) if errors else (settings, errors)


def _ordered(errors: dict[str, str]) -> dict[str, str]:
    order = {field.name: index for index, field in enumerate(_fields())}
    return dict(sorted(errors.items(), key=lambda item: order.get(item[0], len(order))))


def field_errors(texts: dict[str, str]) -> dict[str, str]:
    """Field name -> reason for every bad field, in form order; empty when the form is valid."""
    return _ordered(_validate(texts)[1])


def parse_values(texts: dict[str, str]) -> Settings:
    """Turn the form's text (field name -> what the user typed) into validated `Settings`.

    Empty text means the default (None for the optional fields); a missing name is the same
    as empty. Raises `SettingsError` with `<label>: <reason>` for the first bad field.
    """
    settings, errors = _validate(texts)
    if settings is not None:
        return settings
    errors = _ordered(errors)
    by_name = _field_by_name()
    name, reason = next(iter(errors.items()))
    label = by_name[name].label if name in by_name else "Settings"
    more = len(errors) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    raise SettingsError(f"{label}: {reason}{suffix}")


def _toml_string(text: str) -> str:
    out = ['"']
    for char in text:
        code = ord(char)
        if char == '"':
            out.append('\\"')
        elif char == "\\":
            out.append("\\\\")
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif char == "\r":
            out.append("\\r")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        elif 0xD800 <= code <= 0xDFFF:
            raise ValueError("it is not valid Unicode (a file name in another encoding?)")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # e.g. 0.7, 1e-05, 1e+16: all valid TOML floats
    if isinstance(value, (str, os.PathLike)):
        return _toml_string(os.fspath(value))
    raise ValueError(f"cannot be written to TOML: {value!r}")


def render_settings(settings: Settings) -> str:
    """config.toml text holding the values of `settings` that differ from the defaults."""
    lines = [_HEADER]
    for field in _fields():
        value = getattr(settings, field.name)
        if value is None or value == field.default:
            continue
        try:
            rendered = _toml_value(value)
        except ValueError as error:
            raise SettingsError(f"{field.label}: cannot save this value: {error}") from None
        comment = "".join(f"# {line}\n" for line in textwrap.wrap(field.description, 92))
        lines.append(f"\n{comment}{field.name} = {rendered}\n")
    return "".join(lines)


def save_settings(config_file: Path, settings: Settings) -> None:
    """Write `settings` to `config_file` atomically (mode 0600), verified by loading it back.

    The new text goes to a temporary file beside `config_file`, which is re-read with
    `load_settings` and must give equal settings before it replaces `config_file`; on any
    failure the old file is left as it was and `SettingsError` says why in one line.
    """
    config_file = Path(config_file)
    text = render_settings(settings)
    try:  # refuse settings that bypassed validation (model_construct) before touching the disk
        Settings.model_validate(tomllib.loads(text))
    except ValidationError as error:
        raise SettingsError(f"not saved: {describe_validation_error(error, str(config_file))}") from None
    fix = "check that its folder exists and is writable, or choose another with --data-dir"

    def loads_back_the_same(written: Path) -> None:
        try:
            reread = load_settings(written)
        except SettingsError as error:
            raise SettingsError(f"{config_file}: not saved, the new file would not load ({error})") from None
        if reread != settings:
            raise SettingsError(f"{config_file}: not saved, the new file would not load back the same settings")

    try:
        replace_atomically(config_file, text, mode=CONFIG_FILE_MODE, check=loads_back_the_same)
    except OSError as error:
        reason = error.strerror or str(error)
        raise SettingsError(f"cannot save settings to {config_file}: {reason}; {fix}") from None


def changed_restart_fields(old: Settings, new: Settings) -> list[str]:
    """Labels of the fields that differ between `old` and `new` and only apply after a restart."""
    return [
        field.label
        for field in _fields()
        if field.restart_needed and getattr(old, field.name) != getattr(new, field.name)
    ]
