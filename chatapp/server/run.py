"""Running the server: uvicorn on the app, a line saying where, a clean stop on Ctrl-C.

On Ctrl-C uvicorn stops taking connections and gives the requests in flight a few seconds;
then the serving stack is closed: what still runs is cancelled and every KV block handed to
the cache is written before the process exits, so nothing is left half-written.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
from collections.abc import Callable
from types import FrameType

import uvicorn

from chatapp.errors import ChatappError
from chatapp.server.access import AccessPolicy, is_loopback_name
from chatapp.server.app import create_app
from chatapp.server.context import ServerContext
from chatapp.server.metrics import ServerMetrics
from chatapp.services.cache_advice import AdviceMemo
from chatapp.services.model_pool import ModelPool

GRACEFUL_SHUTDOWN_SECONDS = 5
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _stop_as_interrupted(_signal: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def check_port_free(host: str, port: int) -> None:
    """Fail before the model loads when the address cannot be bound (in use, or not this machine's)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise ChatappError(
            f"cannot listen on {host}: {error.strerror}; pass an address of this machine with --host"
        ) from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            raise ChatappError(
                f"cannot listen on {host}:{port} ({error.strerror}); choose another port with --port"
            ) from None


def build_server(
    pool: ModelPool,
    *,
    host: str,
    port: int,
    api_key: str | None,
    body_limit_bytes: int,
    log_level: str = "info",
    access: AccessPolicy | None = None,
) -> tuple[uvicorn.Server, ServerContext]:
    """The app on `pool`'s models in a uvicorn server not yet started (`serve` runs it; tests run it on
    a thread), and what its routes share."""
    workspace = pool.default.workspace
    metrics = ServerMetrics(
        pool.default.cache_figures,
        AdviceMemo(workspace.kv_cache_dir, workspace.settings).latest,
        pool.default.flash_attention,
    )
    access = access if access is not None else AccessPolicy.for_address(is_loopback_name(host))
    context = ServerContext(pool, metrics, body_limit_bytes, api_key, access)
    config = uvicorn.Config(
        create_app(context),
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        lifespan="off",
    )
    return uvicorn.Server(config), context


def serve(
    pool: ModelPool,
    *,
    host: str,
    port: int,
    api_key: str | None,
    body_limit_bytes: int,
    say: Callable[[str], None],
    access: AccessPolicy | None = None,
) -> None:
    """Serve until interrupted; every model is closed on the way out, the started one last."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    serving = pool.default
    server, context = build_server(
        pool, host=host, port=port, api_key=api_key, body_limit_bytes=body_limit_bytes, access=access
    )
    shown_host = f"[{host}]" if ":" in host else host
    say(
        f"chatapp serving {serving.model.id} at http://{shown_host}:{port}/v1 (OpenAI) "
        f"and http://{shown_host}:{port}/api (Ollama)"
    )
    info = serving.engine.info
    if info.gpu_layers > 0:
        say(f"{info.gpu_layers} layers on {info.device}")
    if info.kv_type != "f16":
        say(f"KV cache in {info.kv_type}")
    if info.flash_attention_why:
        say(f"flash attention {'on' if info.flash_attention else 'off'} ({info.flash_attention_why})")
    if pool.any_model or pool.aliases:
        say(f"it answers to {context.names_answered()}")
    others = len(pool.listed()) - len(pool.default_names())
    if others:
        found = f"{others} more model{'s' if others > 1 else ''} found on this machine"
        say(f"and {found}, each loaded when a request names it (GET /v1/models)")
    for notice in serving.notices:
        say(f"warning: {notice}")
    if context.access.allowed_origins:
        say(f"web pages at {', '.join(context.access.allowed_origins)} may call it (--allowed-origins)")
    if not is_loopback_name(host) and api_key is None:
        say(
            f"warning: listening on {host} without an API key: anyone who can reach this port can use the model; "
            "pass --api-key KEY (or set CHATAPP_API_KEY)"
        )
    # uvicorn shuts down on SIGTERM as on Ctrl-C, then sends the signal again: by default that
    # would end the process before the cache is written. Here it ends `server.run()` instead.
    previous = signal.signal(signal.SIGTERM, _stop_as_interrupted)
    try:
        server.run()
    except KeyboardInterrupt:
        pass  # uvicorn raises the Ctrl-C (or SIGTERM) again once it has shut down: the stop asked for
    finally:
        signal.signal(signal.SIGTERM, previous)
        try:
            pool.close()
        finally:
            serving.close()
    say("chatapp server stopped; the cache is written")
