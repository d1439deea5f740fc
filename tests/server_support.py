"""A real `chatapp serve` stack on a free loopback port, for the tests of chatapp/server.

The server runs in this process (uvicorn on a thread) so that a test can reach the engine's
gate and hold an answer at a known token; the clients talk to it over real HTTP.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from chatapp.benchmark.server_process import free_port
from chatapp.engine.engine import Engine
from chatapp.engine.gate import HOLD_TIMEOUT_SECONDS, Step
from chatapp.models.catalog import ModelCatalog
from chatapp.server.context import ServerContext
from chatapp.server.run import build_server
from chatapp.services.model_pool import ModelPool, PoolLimits
from chatapp.services.serving import ModelCard, Serving, ServingOptions
from chatapp.services.startup import open_workspace
from tests.conftest import local
from tests.cut_proxy import CutProxy, cut_proxy

# Greedy and short: reproducible answers, a fast run on two cores.
SERVER_SETTINGS = {"temperature": 0.0, "context_cap": 1024, "sequences": 4, "threads": 1}
SHORT_ANSWER_TOKENS = 12  # what a request without max_tokens gets (`chatapp serve --max-tokens 12`)
START_TIMEOUT_S = 120.0
# Long enough that the first cache block is full, so a second request can reuse it.
SYSTEM_PROMPT = (
    "You are a careful assistant for lighthouse keepers. Answer in one short sentence, name the "
    "lighthouse when you know it, and never invent dates. Lighthouses guide ships past rocks at night, "
    "each with its own pattern of flashes so that sailors can tell them apart from far away."
)


@dataclass
class RunningServer:
    serving: Serving
    context: ServerContext
    url: str

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def engine(self) -> Engine:
        """The server's in-process engine, for a test that holds it at a step."""
        return local(self.serving.engine)

    @property
    def model_id(self) -> str:
        return self.serving.model.id

    @property
    def model(self) -> ModelCard:
        return self.serving.model


@contextmanager
def running_server(
    data_dir: Path,
    model_path: Path,
    *,
    api_key: str | None = None,
    max_pending: int = 16,
    body_limit_bytes: int = 1 << 20,
    default_max_tokens: int | None = SHORT_ANSWER_TOKENS,
    aliases: tuple[str, ...] = (),
    any_model: bool = False,
    catalog: ModelCatalog | None = None,
    limits: PoolLimits | None = None,
    clock: Callable[[], float] = time.monotonic,
    **settings: object,
) -> Iterator[RunningServer]:
    """Serve the model from `data_dir` until the block ends; then stop and close as Ctrl-C does."""
    workspace = open_workspace(str(data_dir), {**SERVER_SETTINGS, "model": str(model_path), **settings})
    serving = Serving(workspace, ServingOptions(max_pending=max_pending, default_max_tokens=default_max_tokens))
    port = free_port()
    pool = ModelPool(
        serving,
        catalog=catalog,
        open_serving=serving.for_model,
        limits=limits,
        aliases=aliases,
        any_model=any_model,
        clock=clock,
    )
    server, context = build_server(
        pool, host="127.0.0.1", port=port, api_key=api_key, body_limit_bytes=body_limit_bytes, log_level="warning"
    )
    thread = threading.Thread(target=server.run, name="test-server", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            assert thread.is_alive(), "the server thread ended before it started"
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        yield RunningServer(serving, context, f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        thread.join()
        try:
            pool.close()
        finally:
            serving.close()


BACKEND_KEY = "backend-test-key"


@dataclass
class Backend:
    """A real `chatapp serve` (with an API key) behind a proxy a test can cut: a remote engine to use."""

    server: RunningServer
    proxy: CutProxy

    @property
    def url(self) -> str:
        return self.proxy.url

    @property
    def key(self) -> str:
        return BACKEND_KEY

    def settings(self) -> dict[str, object]:
        """Settings that make chatapp use this backend."""
        return {"backend": self.url, "backend_key": BACKEND_KEY}


@contextmanager
def running_backend(data_dir: Path, model_path: Path) -> Iterator[Backend]:
    with running_server(data_dir, model_path, api_key=BACKEND_KEY) as server, cut_proxy(server.port) as proxy:
        yield Backend(server, proxy)


SOME_STREAMED_TEXT = re.compile(rb'"content": ?"[^"]')  # a streamed event that carries text


@contextmanager
def dying_mid_answer(backend: Backend, after_tokens: int = 3) -> Iterator[None]:
    """The backend 'dies' in the middle of the next answer: once it has made `after_tokens` tokens,
    is held there, and some text has reached the client, the connection to it is cut."""
    with backend.server.engine.holding(Step.TOKEN, after_tokens) as gate:

        def cut_when_held() -> None:
            assert gate.wait_until_holding()
            assert backend.proxy.wait_until_forwarded(SOME_STREAMED_TEXT, HOLD_TIMEOUT_SECONDS)
            backend.proxy.cut()

        cutter = threading.Thread(target=cut_when_held, name="test-cutter")
        cutter.start()
        try:
            yield
        finally:
            cutter.join()
