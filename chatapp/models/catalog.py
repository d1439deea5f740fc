"""The models found in every place (places.py), each under a short name, and finding one by name.

Names follow the tool that holds the model: Ollama's `name:tag` (`llama3.2:3b`,
`user/model:tag`), `org/repo:file` for the Hugging Face cache and LM Studio, the file's own
name for loose files. A split model (`-00001-of-00003.gguf`) is one model named without its
part numbers; its first part is the path llama.cpp loads.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from chatapp.models.gguf_header import GgufError, GgufHeader, read_header
from chatapp.models.places import Layout, ModelPlace
from chatapp.models.summary import ModelSummary, summarize

SPLIT_PART = re.compile(r"^(?P<base>.+)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
OLLAMA_REGISTRY = "registry.ollama.ai"
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
FOLDER_DEPTH = 4  # how deep loose files are looked for below a folder
# Headers read, by (path, size, mtime): shared by every catalog of the process, so a second listing
# (F7 again, /api/tags, `--model NAME` after `models`) reads only what changed.
_headers: dict[tuple[Path, int, int], GgufHeader | str] = {}
_headers_lock = threading.Lock()


@dataclass(frozen=True)
class FoundModel:
    name: str
    source: str  # the tool whose place holds it: ollama, huggingface, lmstudio, llama.cpp, jan, gpt4all, folder
    parts: tuple[Path, ...]  # the files, the first one what llama.cpp opens
    size_bytes: int
    summary: ModelSummary | None  # None: its header could not be read (see `problem`)
    problem: str = ""  # why it cannot be loaded: unreadable, a split with parts missing

    @property
    def path(self) -> Path:
        return self.parts[0]

    @property
    def can_chat(self) -> bool:
        return self.summary is not None and not self.problem and self.summary.use.value == "language model"


@dataclass(frozen=True)
class _Candidate:
    name: str
    source: str
    parts: tuple[Path, ...]
    problem: str = ""


class ModelCatalog:
    """Looks through the places on demand; headers already read (by any catalog) are kept while their
    files are unchanged."""

    def __init__(self, places: Sequence[ModelPlace]) -> None:
        self.places = tuple(places)

    def models(self) -> list[FoundModel]:
        """Every model found, each name once (a name found twice keeps the first; the others get `@source`)."""
        found: list[FoundModel] = []
        names: set[str] = set()
        seen_files: set[Path] = set()
        for candidate in (candidate for place in self.places for candidate in _safely(place)):
            real = _real(candidate.parts[0])
            if real in seen_files:
                continue  # the same file reached through two places (a link, a folder named twice)
            seen_files.add(real)
            name = candidate.name if candidate.name.lower() not in names else f"{candidate.name}@{candidate.source}"
            names.add(name.lower())
            found.append(self._found(candidate, name))
        return found

    def find(self, name: str) -> FoundModel:
        """The model called `name` (any case; `model` alone means `model:latest`, or its only tag; a part
        of one name only, that model).

        Raises LookupError with a one-line message naming the closest names.
        """
        models = self.models()
        by_name = {model.name.lower(): model for model in models}
        wanted = name.strip().lower()
        exact = by_name.get(wanted) or by_name.get(f"{wanted}:latest") or by_name.get(wanted.removesuffix(":latest"))
        if exact is not None:
            return exact
        tagged = [model for model in models if model.name.lower().split(":", 1)[0] == wanted]
        if len(tagged) == 1:
            return tagged[0]
        containing = tagged or [model for model in models if wanted in model.name.lower()]
        if any(model.can_chat for model in containing):
            containing = [model for model in containing if model.can_chat]  # not the projector beside it
        if len(containing) == 1:
            return containing[0]
        if containing:
            names = ", ".join(model.name for model in containing[:4]) + (", ..." if len(containing) > 4 else "")
            raise LookupError(f"{name!r} could be {len(containing)} models: {names}; give the whole name")
        choices = _closest(wanted, models)
        if choices:
            raise LookupError(f"no model named {name!r}; closest: {', '.join(choices)} (`chatapp models` lists them)")
        if not models:
            raise LookupError(f"no model named {name!r}: no GGUF models were found on this machine; pass --model PATH")
        raise LookupError(f"no model named {name!r}; `chatapp models` lists the {len(models)} found")

    def _found(self, candidate: _Candidate, name: str) -> FoundModel:
        size = sum(_size(part) for part in candidate.parts)
        if candidate.problem:
            return FoundModel(name, candidate.source, candidate.parts, size, None, candidate.problem)
        headers = []
        for part in candidate.parts:
            header = self._header(part)
            if isinstance(header, str):
                return FoundModel(name, candidate.source, candidate.parts, size, None, header)
            headers.append(header)
        return FoundModel(name, candidate.source, candidate.parts, size, summarize(headers))

    def _header(self, path: Path) -> GgufHeader | str:
        try:
            status = path.stat()
        except OSError as error:
            return f"cannot read it: {error.strerror}"
        key = (path, status.st_size, status.st_mtime_ns)
        with _headers_lock:
            known = _headers.get(key)
        if known is None:
            try:
                known = read_header(path)
            except GgufError as error:
                known = str(error)
            except (OSError, ValueError, RecursionError, MemoryError) as error:  # a file no tool should write
                known = f"its header cannot be read ({type(error).__name__})"
            with _headers_lock:
                _headers[key] = known
        return known


def split_parts(first: Path) -> list[Path]:
    """Every part of the split model whose first part is `first` (the file alone when it is not one)."""
    match = SPLIT_PART.match(first.name)
    if match is None:
        return [first]
    count = int(match["count"])
    return [first.with_name(f"{match['base']}-{number:05d}-of-{count:05d}.gguf") for number in range(1, count + 1)]


def _closest(wanted: str, models: list[FoundModel], count: int = 3) -> list[str]:
    """The names most like `wanted`, each compared whole and by its last parts (its file, its tag)."""

    def likeness(model: FoundModel) -> float:
        name = model.name.lower()
        pieces = {name, name.rsplit(":", 1)[-1], name.rsplit("/", 1)[-1], name.split(":", 1)[0]}
        return max(difflib.SequenceMatcher(None, wanted, piece).ratio() for piece in pieces)

    scored = sorted(((likeness(model), model.name) for model in models), key=lambda pair: -pair[0])
    return [name for score, name in scored[:count] if score >= 0.6]


def _safely(place: ModelPlace) -> list[_Candidate]:
    """A place's models; a place that fails midway (permissions, a folder removed) gives what it gave."""
    found: list[_Candidate] = []
    with contextlib.suppress(OSError):
        found.extend(_candidates(place))  # extend keeps what came before a failure
    return found


def _candidates(place: ModelPlace) -> Iterator[_Candidate]:
    if place.layout is Layout.OLLAMA:
        yield from _ollama(place)
    elif place.layout is Layout.HUB:
        yield from _hub(place)
    elif place.layout is Layout.FOLDERS:
        for publisher in _folders(place.root):
            for repo in _folders(publisher):
                yield from _grouped(place.source, _gguf_files(repo, 2), f"{publisher.name}/{repo.name}:")
    else:
        for folder, files in _files_by_folder(place.root):
            relative = folder.relative_to(place.root).as_posix()
            yield from _grouped(place.source, files, f"{relative}:" if relative != "." else "")


def _ollama(place: ModelPlace) -> Iterator[_Candidate]:
    """Ollama's models: each manifest names its GGUF layer's blob by digest."""
    manifests = place.root / "manifests"
    for manifest in sorted(manifests.rglob("*")):
        relative = manifest.relative_to(manifests).parts
        if not manifest.is_file() or len(relative) != 4:
            continue
        host, namespace, model, tag = relative
        try:
            layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
        except (OSError, ValueError, AttributeError):
            continue
        digests = [
            layer.get("digest")
            for layer in (layers if isinstance(layers, list) else [])
            if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_LAYER
        ]
        if not digests or not isinstance(digests[0], str) or "/" in digests[0]:
            continue
        if host == OLLAMA_REGISTRY:
            name = f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
        else:
            name = f"{host}/{namespace}/{model}:{tag}"
        blob = place.root / "blobs" / digests[0].replace(":", "-")
        problem = "" if blob.is_file() else f"its blob {blob.name} is missing; run `ollama pull {name}`"
        yield _Candidate(name, place.source, (blob,), problem)


def _hub(place: ModelPlace) -> Iterator[_Candidate]:
    """The Hugging Face cache: one revision per repository (refs/main's when it is there, else the newest)."""
    for repository in sorted(place.root.glob("models--*")):
        repo_id = repository.name.removeprefix("models--").replace("--", "/")
        snapshots = _folders(repository / "snapshots")
        if not snapshots:
            continue
        try:
            main = (repository / "refs" / "main").read_text(encoding="utf-8").strip()
        except OSError:
            main = ""
        chosen = next((folder for folder in snapshots if folder.name == main), None)
        if chosen is None:
            chosen = max(snapshots, key=lambda folder: folder.stat().st_mtime)
        yield from _grouped(place.source, _gguf_files(chosen, FOLDER_DEPTH), f"{repo_id}:")


def _grouped(source: str, files: Sequence[Path], prefix: str) -> Iterator[_Candidate]:
    """One candidate per model: the parts of a split model together, named without their numbers."""
    splits: dict[tuple[Path, str, int], dict[int, Path]] = {}
    for file in files:
        match = SPLIT_PART.match(file.name)
        if match is None:
            yield _Candidate(prefix + file.name[: -len(".gguf")], source, (file,))
            continue
        key = (file.parent, match["base"], int(match["count"]))
        splits.setdefault(key, {})[int(match["number"])] = file
    for (_folder, base, count), parts in splits.items():
        ordered = tuple(parts[number] for number in sorted(parts))
        problem = ""
        if sorted(parts) != list(range(1, count + 1)):
            problem = f"a split model with {len(parts)} of its {count} parts; download the missing parts"
        yield _Candidate(prefix + base, source, ordered, problem)


def _files_by_folder(root: Path, depth_limit: int = FOLDER_DEPTH) -> Iterator[tuple[Path, list[Path]]]:
    """The .gguf files below `root` (hidden folders and the hub layout's folders left out), folder by folder."""
    for folder, subfolders, files in os.walk(root, followlinks=True):
        here = Path(folder)
        depth = len(here.relative_to(root).parts)
        subfolders[:] = sorted(
            name for name in subfolders if not name.startswith((".", "models--")) and depth < depth_limit
        )
        ggufs = sorted(here / name for name in files if name.lower().endswith(".gguf"))
        if ggufs:
            yield here, ggufs


def _gguf_files(folder: Path, depth: int) -> list[Path]:
    return [file for _here, files in _files_by_folder(folder, depth) for file in files]


def _folders(path: Path) -> list[Path]:
    try:
        return sorted(child for child in path.iterdir() if child.is_dir() and not child.name.startswith("."))
    except OSError:
        return []


def _real(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
