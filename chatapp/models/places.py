"""Where the tools people use keep their GGUF models, and how each lays them out.

Each tool has its own layout: Ollama names blobs by digest and finds them through manifests,
the Hugging Face cache (also llama.cpp's `-hf` cache since it moved there) keeps
`models--org--repo/snapshots/<revision>/` of links into blobs, LM Studio keeps
`<publisher>/<repo>/` folders, and llama.cpp's older cache, Jan and GPT4All keep plain files.
The places are computed from the home folder and the environment given, so tests can lay out
a home of their own.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path


class Layout(StrEnum):
    OLLAMA = "ollama"  # manifests/<host>/<namespace>/<model>/<tag> -> blobs/sha256-<hex>
    HUB = "hub"  # models--<org>--<repo>/snapshots/<revision>/<file>.gguf
    FOLDERS = "folders"  # <publisher>/<repo>/<file>.gguf (LM Studio)
    FILES = "files"  # .gguf files in the folder or below it


@dataclass(frozen=True)
class ModelPlace:
    source: str  # which tool put the models there: ollama, huggingface, lmstudio, ...
    root: Path
    layout: Layout


def model_places(
    home: Path, environ: Mapping[str, str], extra_folders: Sequence[Path] = (), platform: str = sys.platform
) -> list[ModelPlace]:
    """Every place to look, the folders named in the settings first; places that do not exist are left out."""
    places = [ModelPlace("folder", folder.expanduser(), Layout.FILES) for folder in extra_folders]
    places += [ModelPlace("ollama", root, Layout.OLLAMA) for root in _ollama_roots(home, environ)]
    places += [ModelPlace("huggingface", root, Layout.HUB) for root in _hub_roots(home, environ)]
    for root in _llama_cpp_roots(home, environ, platform):
        places += [ModelPlace("llama.cpp", root, Layout.HUB), ModelPlace("llama.cpp", root, Layout.FILES)]
    places += [ModelPlace("lmstudio", root, Layout.FOLDERS) for root in _lm_studio_roots(home)]
    application_data = _application_data(home, environ, platform)
    places += [
        ModelPlace("jan", root, Layout.FILES)
        for root in (home / "jan" / "models", application_data / "Jan" / "data" / "llamacpp" / "models",
                     application_data / "Jan" / "data" / "models")
    ]  # fmt: skip
    places.append(ModelPlace("gpt4all", application_data / "nomic.ai" / "GPT4All", Layout.FILES))
    seen: set[tuple[Path, Layout]] = set()
    found = []
    for place in places:
        key = (place.root, place.layout)
        if key not in seen and readable_folder(place.root):
            seen.add(key)
            found.append(place)
    return found


def readable_folder(path: Path) -> bool:
    """A folder we may look into: one we cannot read (Ollama's service home is 0700) is as if absent."""
    try:
        return path.is_dir() and os.access(path, os.R_OK | os.X_OK)
    except OSError:
        return False


def _ollama_roots(home: Path, environ: Mapping[str, str]) -> list[Path]:
    if environ.get("OLLAMA_MODELS"):
        return [Path(environ["OLLAMA_MODELS"]).expanduser()]
    return [home / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]


def _hub_roots(home: Path, environ: Mapping[str, str]) -> list[Path]:
    """The Hugging Face hub cache, found as huggingface_hub finds it."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if environ.get(variable):
            return [Path(environ[variable]).expanduser()]
    if environ.get("HF_HOME"):
        return [Path(environ["HF_HOME"]).expanduser() / "hub"]
    cache = Path(environ["XDG_CACHE_HOME"]).expanduser() if environ.get("XDG_CACHE_HOME") else home / ".cache"
    return [cache / "huggingface" / "hub"]


def _llama_cpp_roots(home: Path, environ: Mapping[str, str], platform: str) -> list[Path]:
    if environ.get("LLAMA_CACHE"):
        return [Path(environ["LLAMA_CACHE"]).expanduser()]
    if platform == "darwin":
        return [home / "Library" / "Caches" / "llama.cpp"]
    cache = Path(environ["XDG_CACHE_HOME"]).expanduser() if environ.get("XDG_CACHE_HOME") else home / ".cache"
    return [cache / "llama.cpp"]


def _lm_studio_roots(home: Path) -> list[Path]:
    """LM Studio's models folder: the one its settings name, else the default (and the old one)."""
    roots = []
    try:
        settings = json.loads((home / ".lmstudio" / "settings.json").read_text(encoding="utf-8"))
        if isinstance(settings, dict) and isinstance(settings.get("downloadsFolder"), str):
            roots.append(Path(settings["downloadsFolder"]).expanduser())
    except (OSError, ValueError):
        pass
    return [*roots, home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def _application_data(home: Path, environ: Mapping[str, str], platform: str) -> Path:
    if platform == "darwin":
        return home / "Library" / "Application Support"
    if platform == "win32" and environ.get("APPDATA"):
        return Path(environ["APPDATA"])
    return Path(environ["XDG_DATA_HOME"]).expanduser() if environ.get("XDG_DATA_HOME") else home / ".local" / "share"
