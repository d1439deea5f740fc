"""Shared fixtures: the real bundled model, loaded once per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from chatapp.engine.contract import EngineClient
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.llama_native import NativeModel, offload_device
from chatapp.model_files import bundled_model_path

if TYPE_CHECKING:
    from tests.server_support import Backend

# Flash attention's `auto` off, not measured, here and in the processes the tests start: reuse counts
# differ with it on, and which setting a machine's measurement picks must not decide a test
# (tests/chatapp/engine/test_flash_choice.py measures).
os.environ["CHATAPP_FLASH_AUTO"] = "off"

# Small contexts keep the suite fast on two cores; the behaviour under test is the same.
TEST_CONTEXT = 1024
TEST_SEQUENCES = 2


# `make test-vulkan` (and the GPU check) set this: the tests marked `device` must then run on an
# offload device, every layer on it, never quietly on the CPU.
ON_DEVICE = bool(os.environ.get("CHATAPP_TEST_DEVICE"))


def pytest_report_header() -> str | None:
    """Say where the device tests ran and how: a run on llvmpipe turns ggml-vulkan's fusion off (see the Makefile)."""
    if not ON_DEVICE:
        return None
    device = offload_device() or "none"
    if not device.startswith("Vulkan"):
        return f"device: {device}"
    return f"device: {device}; operator fusion {'off' if 'GGML_VK_DISABLE_FUSION' in os.environ else 'on'}"


@pytest.fixture(scope="session", autouse=True)
def device_when_asked() -> None:
    if ON_DEVICE and offload_device() is None:
        pytest.exit(
            "CHATAPP_TEST_DEVICE is set but this llama.cpp has no offload device "
            "(a CPU build, or a Vulkan one with no device visible: GGML_VK_VISIBLE_DEVICES=0 shows llvmpipe)",
            returncode=3,
        )


def local(engine: EngineClient | None) -> Engine:
    """The in-process engine behind the contract, for a test that holds it at a step or reads its internals."""
    assert isinstance(engine, Engine), f"expected the local engine, got {type(engine).__name__}"
    return engine


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The bundled model, or $CHATAPP_TEST_MODEL (the GPU check runs the engine tests on a smaller one)."""
    override = os.environ.get("CHATAPP_TEST_MODEL")
    return Path(override) if override else bundled_model_path()


@pytest.fixture(scope="session")
def vocab(model_path: Path) -> Iterator[NativeModel]:
    """The bundled model's vocabulary only (no weights): fast, for tokenizer-level tests."""
    model = NativeModel(model_path, vocab_only=True)
    yield model
    model.close()


@pytest.fixture(scope="session")
def engine(model_path: Path) -> Iterator[Engine]:
    """One engine for the whole session; tests pick their own sequence or disable reuse."""
    with Engine(EngineConfig(model_path=model_path, context_cap=TEST_CONTEXT, sequences=TEST_SEQUENCES)) as shared:
        yield shared


@pytest.fixture(scope="session")
def backend(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[Backend]:
    """One real `chatapp serve` on loopback for the session, used as a remote engine (--backend)."""
    from tests.server_support import running_backend

    with running_backend(tmp_path_factory.mktemp("backend-data"), model_path) as running:
        yield running


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private data folder; CHATAPP_HOME points at it so nothing touches the real one."""
    folder = tmp_path / "data"
    monkeypatch.setenv("CHATAPP_HOME", str(folder))
    return folder
