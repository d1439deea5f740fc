"""What the routes share: the served models, the metrics, the limits, the key and who may call (one per app)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from anyio import to_thread
from fastapi import Request

from chatapp.errors import ModelError
from chatapp.server.access import AccessPolicy
from chatapp.server.errors import ApiError
from chatapp.server.metrics import ServerMetrics
from chatapp.services.model_pool import UNCHANGED, KeepAlive, ModelNotServed, ModelPool, ModelRefused, ModelsBusy
from chatapp.services.serving import Serving

RETRY_AFTER_SECONDS = "1"  # what a 503 asks the client to wait
LOOPBACK_ONLY = AccessPolicy(check_host=True)  # bound to loopback, no other names or pages allowed


@dataclass
class ServerContext:
    """What the routes share: the served models, the metrics, the limits, the key and the Host and Origin rules.

    The pool holds the model the server started with (under its id and aliases, or every name
    with `any_model`) and loads any other model on this machine a request names.
    """

    pool: ModelPool
    metrics: ServerMetrics
    body_limit_bytes: int = 8 << 20
    api_key: str | None = None
    access: AccessPolicy = LOOPBACK_ONLY

    @property
    def serving(self) -> Serving:
        """The model the server started with: what routes that name no model use."""
        return self.pool.default

    def names_answered(self) -> str:
        """The names requests may use, in words (for the start-up line)."""
        listed = ", ".join(self.pool.default_names())
        return f"any model name ({listed} listed)" if self.pool.any_model else listed

    def check_model(self, name: str, param: str = "model") -> None:
        """A 404 unless `name` is a model served here (as /v1/models or /api/tags list them)."""
        try:
            self.pool.check(name)
        except ModelNotServed as error:
            raise ApiError(404, str(error), param=param, kind="not_found_error") from None

    @asynccontextmanager
    async def serving_for(
        self, name: str, keep_alive_s: KeepAlive = UNCHANGED, param: str = "model"
    ) -> AsyncIterator[Serving]:
        """The model `name` names, loaded first if need be (off the event loop: loading takes seconds),
        held for the block: start the request inside it (once started, its answer keeps the model)."""
        try:
            serving, release = await to_thread.run_sync(lambda: self.pool.acquire(name, keep_alive_s))
        except ModelNotServed as error:
            raise ApiError(404, str(error), param=param, kind="not_found_error") from None
        except ModelRefused as error:
            raise ApiError(400, str(error), param=param) from None
        except ModelsBusy as error:
            raise ApiError(503, str(error), kind="server_error", headers={"Retry-After": RETRY_AFTER_SECONDS}) from None
        except ModelError as error:
            raise ApiError(500, str(error), param=param, kind="server_error") from None
        try:
            yield serving
        finally:
            release()


def context_of(request: Request) -> ServerContext:
    """The serving stack the app was built with (every route's first step)."""
    context: ServerContext = request.app.state.context
    return context
