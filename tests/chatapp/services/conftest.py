"""Fixtures for the service tests: one engine per test module, a fresh database per test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from chatapp.engine.engine import Engine
from chatapp.services.library import Library, open_library
from chatapp.services.startup import Workspace, open_workspace
from tests.conftest import local
from tests.service_support import Hold, settings


@pytest.fixture(scope="module")
def shared_engine(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[Engine]:
    """One engine (with its KV cache in a folder of its own) for every test of a module."""
    workspace = open_workspace(str(tmp_path_factory.mktemp("engine-data")), settings(model_path))
    engine = local(workspace.open_engine())
    assert engine.cache is not None, engine.cache_problem
    yield engine
    engine.close()


@pytest.fixture
def hold(shared_engine: Engine) -> Iterator[Hold]:
    """`hold(Step.TOKEN, after=3)`: the shared engine stops after the third answer token until a cancel.

    Released at the end of the test, so a test that forgets cannot stall the next one.
    """
    with ExitStack() as stack:
        yield lambda step, after: stack.enter_context(shared_engine.holding(step, after))


@pytest.fixture
def workspace(data_dir: Path, model_path: Path) -> Workspace:
    return open_workspace(str(data_dir), settings(model_path))


@pytest.fixture
def library(workspace: Workspace) -> Iterator[Library]:
    opened = open_library(workspace)
    yield opened
    opened.close()
