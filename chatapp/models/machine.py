"""This machine's catalog: the places in this user's home and environment, and the bundled model."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from chatapp.errors import ModelError
from chatapp.model_files import bundled_model_path, check_gguf_file
from chatapp.models.catalog import FoundModel, ModelCatalog
from chatapp.models.places import Layout, ModelPlace, model_places


def machine_catalog(extra_folders: Sequence[Path] = ()) -> ModelCatalog:
    """The models in the folders named, the bundled model, then those other tools downloaded."""
    places = model_places(Path.home(), os.environ, extra_folders)
    named = sum(1 for place in places if place.source == "folder")
    with contextlib.suppress(ModelError):  # not installed: the other places still count
        places.insert(named, ModelPlace("bundled", bundled_model_path().parent, Layout.FILES))
    return ModelCatalog(places)


def split_folders(text: str | None) -> tuple[Path, ...]:
    """The `model_folders` setting: folders separated as in PATH (`:`, `;` on Windows)."""
    return tuple(Path(part).expanduser() for part in (text or "").split(os.pathsep) if part.strip())


def looks_like_a_path(value: str) -> bool:
    """A value meant as a file: ends in .gguf, or starts like a path (`/`, `~`, `.`), or has no tag but a `/`."""
    return (
        value.lower().endswith(".gguf")
        or value.startswith(("/", "~", ".", "\\"))
        or (("/" in value or os.sep in value) and ":" not in value)
    )


def resolve_model(
    configured: Path | None, catalog: ModelCatalog | Callable[[], ModelCatalog] = machine_catalog
) -> Path:
    """The GGUF file to load for `--model`/the setting: a path, a name from `chatapp models`, or the bundled model.

    The catalog (or the function that makes it) is asked only for a name: a path or the bundled
    model never looks through other tools' folders. A value that looks like a path but is no
    file is looked up as a name too (`org/repo` names have slashes), then refused as a path.
    """
    if configured is None:
        return check_gguf_file(bundled_model_path())
    text = str(configured)
    if configured.expanduser().exists():
        return check_gguf_file(configured)
    listed = catalog if isinstance(catalog, ModelCatalog) else catalog()
    try:
        found = listed.find(text)
    except LookupError as error:
        if looks_like_a_path(text):
            return check_gguf_file(configured)  # the missing file, named with the fix
        raise ModelError(str(error)) from None
    return check_found(found)


def check_found(found: FoundModel) -> Path:
    """The file to load for a listed model, or a one-line ModelError saying why it cannot chat."""
    if found.problem:
        raise ModelError(f"model {found.name}: {found.problem}")
    if found.summary is not None and not found.can_chat:
        raise ModelError(
            f"model {found.name} is {_article(found.summary.use.value)}, not a language model; pick another"
        )
    return check_gguf_file(found.path)


def _article(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word
