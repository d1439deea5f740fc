"""What every remote engine shares: where the server is, its HTTP calls with one-line errors, and requests on threads.

A remote engine runs each request on a thread of its own, reading the server's event stream
and turning it into engine events; cancelling shuts the connection down (a server computing a
long prompt sends nothing, and a blocked read would not notice a plain close). A network problem
ends the request with a RemoteEngineError whose message names the server and the fix; what was
streamed before it stays with the caller.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from cache.prefix_cache import PrefixCache
from chatapp.engine.events import AnswerText, GenerationResult, GenerationStats, PromptReuse
from chatapp.engine.handle import GenerationHandle
from chatapp.engine.model_card import ModelInfo
from chatapp.engine.requests import GenerationRequest
from chatapp.engine.restore_costs import RestoreCosts
from chatapp.errors import ChatappError
from chatapp.vocabulary import ReuseTier

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
# A server computing a long prompt on a CPU may say nothing for minutes before the first token.
DEFAULT_READ_TIMEOUT_S = 600.0


class RemoteEngineError(ChatappError):
    """The remote engine cannot be reached, refused the request, or dropped it midway."""


class MissingEndpointError(RemoteEngineError):
    """The server has no such endpoint (HTTP 404): it is another kind of server."""


@dataclass(frozen=True)
class RemoteConfig:
    """Where the server is and how to talk to it."""

    url: str
    api_key: str | None = None
    model: str | None = None  # the name to show (and send where the server asks for one)
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S

    @property
    def base_url(self) -> str:
        """The server's root: a trailing `/v1` (an OpenAI-style address) and slashes removed."""
        url = self.url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url


class RemoteClient:
    """HTTP calls to the server with errors turned into one clear line each."""

    def __init__(self, config: RemoteConfig) -> None:
        self.config = config
        self.base_url = config.base_url
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        timeout = httpx.Timeout(config.read_timeout_s, connect=CONNECT_TIMEOUT_S)
        self.http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def get_json(self, path: str) -> dict[str, Any]:
        return self._checked(lambda: self.http.get(path), path)

    def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._checked(lambda: self.http.post(path, json=body), path)

    def _checked(self, call: Any, path: str) -> dict[str, Any]:
        try:
            response: httpx.Response = call()
        except httpx.HTTPError as error:
            raise self.network_error(error) from None
        self.raise_for_status(response, path)
        try:
            data = response.json()
        except ValueError:
            raise RemoteEngineError(f"{self.base_url}{path} did not answer with JSON; is it an LLM server?") from None
        if not isinstance(data, dict):
            raise RemoteEngineError(f"{self.base_url}{path} answered {type(data).__name__}, not an object")
        return data

    def raise_for_status(self, response: httpx.Response, path: str) -> None:
        if response.status_code < 400:
            return
        if response.status_code in (401, 403):
            raise RemoteEngineError(
                f"the engine at {self.base_url} refused the API key (HTTP {response.status_code}); "
                "set --backend-key (backend_key in config.toml) to the server's key"
            )
        detail = error_message(response)
        if response.status_code == 404:
            raise MissingEndpointError(
                f"the server at {self.base_url} has no {path} (HTTP 404: {detail}); check the address (--backend)"
            )
        raise RemoteEngineError(
            f"the engine at {self.base_url} answered HTTP {response.status_code} on {path}: {detail}"
        )

    def network_error(self, error: httpx.HTTPError) -> RemoteEngineError:
        if isinstance(error, httpx.ConnectError):
            return RemoteEngineError(
                f"cannot reach the engine at {self.base_url} ({reason(error)}); start the server or fix --backend"
            )
        if isinstance(error, httpx.TimeoutException):
            return RemoteEngineError(
                f"the engine at {self.base_url} did not answer in time ({type(error).__name__}); "
                "it may be busy or stopped: try again"
            )
        return RemoteEngineError(
            f"the connection to the engine at {self.base_url} broke ({reason(error)}); what was received is kept: "
            "try again"
        )

    def close(self) -> None:
        self.http.close()


class CancellableHandle(GenerationHandle):
    """A handle whose cancel also closes the connection (a server computing a prompt sends nothing to read)."""

    def __init__(self, request: GenerationRequest) -> None:
        super().__init__(request)
        self.response: httpx.Response | None = None

    def cancel(self) -> None:
        super().cancel()
        response = self.response
        if response is None:
            return
        # Closing alone does not wake a thread blocked reading the socket (a server computing a
        # long prompt sends nothing): shut it down, which also tells the server to stop.
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        try:
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
            response.close()
        except Exception:  # the reading thread may be closing it too
            log.debug("closing a cancelled remote response failed", exc_info=True)


class StreamedRequest:
    """One request on its own thread; subclasses turn the server's stream into events and a result.

    `stream()` returns the result; `cancelled_result()` is what a stop asked for ends with.
    """

    def __init__(self, engine: HttpEngine, request: GenerationRequest) -> None:
        self.engine = engine
        self.client = engine.client
        self.handle = CancellableHandle(request)
        self.thread = threading.Thread(target=self._run, name="chatapp-remote", daemon=True)
        self.started = time.perf_counter()
        self.pieces: list[str] = []  # the answer's text as it came
        self._first_text_at: float | None = None

    def start(self) -> None:
        self.thread.start()

    def stream(self) -> GenerationResult:
        raise NotImplementedError

    def cancelled_result(self) -> GenerationResult:
        raise NotImplementedError

    def _run(self) -> None:
        try:
            self.handle.finish(self.stream())
        except BaseException as error:
            if self.handle.cancel_event.is_set():  # a stop asked for: whatever broke, it is a stop
                self.handle.finish(self.cancelled_result())
            elif isinstance(error, RemoteEngineError):
                self.handle.finish(None, error)
            elif isinstance(error, httpx.HTTPError):
                self.handle.finish(None, self.client.network_error(error))
            else:  # a bug, or a reply of the wrong shape: the caller must not wait for ever
                log.exception("remote request failed")
                self.handle.finish(None, error)
        finally:
            self.engine.request_done(self)

    def sampling_fields(self, length_field: str) -> dict[str, Any]:
        """The request's sampling in the fields both APIs share (`length_field`: how the API names max tokens).

        A warm-up asks for one token: the prompt is computed (and kept by the server), nothing is shown.
        No limit is sent for an answer without one: the server answers until the end of generation
        or of its context.
        """
        request = self.handle.request
        sampling = request.sampling
        length = 1 if request.prefill_only else sampling.max_tokens
        fields: dict[str, Any] = {
            **({length_field: length} if length is not None else {}),
            "stream": True,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if sampling.seed is not None:
            fields["seed"] = sampling.seed
        if sampling.top_k > 0:  # llama-server's, vLLM's and chatapp serve's top_k
            fields["top_k"] = sampling.top_k
        if sampling.ignore_eos:  # llama-server, vLLM and chatapp serve all take it
            fields["ignore_eos"] = True
        return fields

    def take_text(self, text: str) -> None:
        """A piece of the answer: out to the reader now (a warm-up shows nothing)."""
        if text and not self.handle.request.prefill_only:
            if self._first_text_at is None:
                self._first_text_at = time.perf_counter()
            self.pieces.append(text)
            self.handle.emit(AnswerText(text=text, token_id=-1))

    def stats(
        self, prompt_tokens: int, reused: int | None, *, reported: bool, generated: int, prefill_ms: float = 0.0
    ) -> GenerationStats:
        """The request's figures; `reused` None when the server does not say (tier UNREPORTED).

        What the server `reported` goes out as the prompt's placement.
        """
        ended = time.perf_counter()
        if reused is None:
            reused, tier = 0, ReuseTier.UNREPORTED
        else:
            reused = max(0, min(reused, prompt_tokens))
            tier = ReuseTier.SERVER if reused else ReuseTier.NONE
        if reported:
            self.handle.emit(PromptReuse(reused, prompt_tokens, tier))
        first = self._first_text_at if self._first_text_at is not None else ended
        return GenerationStats(
            prompt_tokens=prompt_tokens,
            reused_tokens=reused,
            computed_tokens=prompt_tokens - reused,
            reuse_tier=tier,
            generated_tokens=generated,
            ttft_ms=(first - self.started) * 1000,
            total_ms=(ended - self.started) * 1000,
            prefill_ms=prefill_ms,
        )

    def events_of(self, response: httpx.Response, path: str) -> Iterator[dict[str, Any]]:
        """The stream's JSON events until a cancel; the server's refusal or error as RemoteEngineError."""
        handle = self.handle
        handle.response = response
        if response.status_code >= 400 and not handle.cancel_event.is_set():
            response.read()
            self.client.raise_for_status(response, path)
        for chunk in server_events(response):
            if handle.cancel_event.is_set():
                return
            if "error" in chunk:
                raise RemoteEngineError(f"the engine at {self.client.base_url} failed: {error_text(chunk['error'])}")
            yield chunk

    def ended_early(self) -> GenerationResult:
        """The stream closed: a stop asked for, or the server dropped the answer midway."""
        if self.handle.cancel_event.is_set():
            return self.cancelled_result()
        raise RemoteEngineError(
            f"the engine at {self.client.base_url} ended the answer without its last message; "
            "what was received is kept: try again"
        )


class HttpEngine:
    """The requests running on one server, closed together; subclasses say how a request is made.

    The cache is the server's: nothing here to administer, restore or checkpoint.
    """

    cache: PrefixCache | None = None
    cache_problem: str | None = None
    restore_costs: RestoreCosts | None = None
    takes_checkpoints = False

    def __init__(self, client: RemoteClient) -> None:
        self.client = client
        self._running: set[StreamedRequest] = set()
        self._lock = threading.Lock()
        self._closed = False

    def start_request(self, make: type[StreamedRequest], request: GenerationRequest) -> GenerationHandle:
        with self._lock:
            if self._closed:
                raise RuntimeError("the engine is closed")
            running = make(self, request)
            self._running.add(running)
            running.start()
        return running.handle

    def flush_cache(self) -> None:
        """The server stores its own cache: nothing to wait for here."""

    def forget_cached(self, prompts: Sequence[Sequence[int]], keep: Sequence[Sequence[int]] = ()) -> int:
        """The server's cache is its own: nothing here to forget."""
        return 0

    def close(self) -> None:
        with self._lock:
            self._closed = True
            running = list(self._running)
        for request in running:
            request.handle.cancel()
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        for request in running:
            request.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self.client.close()

    def request_done(self, request: StreamedRequest) -> None:
        with self._lock:
            self._running.discard(request)


def served_model_info(
    name: str, description: str, server: str, fingerprint: str, *, n_ctx: int, n_sequences: int, n_vocab: int = 0
) -> ModelInfo:
    """The model card of a model served elsewhere: no file, layers or threads here."""
    return ModelInfo(
        path=None,
        name=name,
        description=description,
        n_ctx_train=n_ctx,
        n_ctx_per_sequence=n_ctx,
        n_sequences=n_sequences,
        flash_attention=False,
        gpu_layers=0,
        threads=0,
        n_vocab=n_vocab,
        server=server,
        fingerprint=fingerprint,
    )


def server_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON objects of a server-sent-event stream (`data: {...}` lines)."""
    for line in response.iter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[len("data:") :].strip()
        if payload == "[DONE]":
            return
        try:
            event = json.loads(payload)
        except ValueError:
            raise RemoteEngineError(f"the engine sent a line that is not JSON: {payload[:80]!r}") from None
        if isinstance(event, dict):
            yield event


def error_message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return one_line(response.text) or response.reason_phrase
    return error_text(data.get("error", data) if isinstance(data, dict) else data)


def error_text(error: object) -> str:
    if isinstance(error, dict):
        return one_line(str(error.get("message") or error))
    return one_line(str(error))


def one_line(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]


def reason(error: httpx.HTTPError) -> str:
    return one_line(str(error), 160) or type(error).__name__
