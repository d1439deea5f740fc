"""Fixtures for the server tests: one running server per test module, and clients for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.server_support import RunningServer, running_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("server-data"), model_path) as running:
        yield running


@pytest.fixture
def client(server: RunningServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300) as opened:
        yield opened


@pytest.fixture
def http(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=300) as opened:
        yield opened
