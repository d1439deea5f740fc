"""A remote engine: chatapp in front of llama-server or another `chatapp serve`, over HTTP.

Prompts stay append-only across the wire: the server's own chat template and tokenizer
(`GET /props`, `POST /tokenize`) build the prompt here, message by message, and its token ids
go to `POST /completion`, so the server's prefix cache sees exactly the prefixes chatapp
would compute. The answer's token ids come back with it (`return_tokens`) and join the
conversation as generated. What the server reused is read from its report (`timings.cache_n`),
after the answer: the server says nothing about it before.

Every request runs on a thread of its own; cancelling closes its connection. A network
problem ends the request with a RemoteEngineError whose message names the server and the fix;
what was streamed before it stays with the caller.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import xxhash

from cache.prefix_cache import PrefixCache
from chatapp.engine.chat_template import FALLBACK_CHATML, ChatTemplate
from chatapp.engine.events import GenerationResult, GenerationStats, PromptPlaced, TokenText
from chatapp.engine.handle import GenerationHandle
from chatapp.engine.model_card import Capabilities, ModelInfo
from chatapp.engine.prompt import PromptBuilder
from chatapp.engine.requests import GenerationRequest
from chatapp.engine.restore_costs import RestoreCosts
from chatapp.errors import ChatappError, ContextOverflowError
from chatapp.vocabulary import ReuseTier, StopReason

log = logging.getLogger(__name__)

REMOTE_CAPABILITIES = Capabilities(
    token_prompts=True, generated_ids=True, reuse_before_first_token=False, local_cache=False
)
CONNECT_TIMEOUT_S = 5.0
# A server computing a long prompt on a CPU may say nothing for minutes before the first token.
DEFAULT_READ_TIMEOUT_S = 600.0
STOP_REASONS = {"eos": StopReason.END, "word": StopReason.STOP_STRING, "limit": StopReason.LENGTH}


class RemoteEngineError(ChatappError):
    """The remote engine cannot be reached, refused the request, or dropped it midway."""


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


class RemoteVocabulary:
    """The server's tokenizer, asked over HTTP (what PromptBuilder needs), and its special tokens' ids."""

    def __init__(self, client: RemoteClient, bos_text: str, eos_text: str) -> None:
        self._client = client
        self.bos_id = self._single_id(bos_text)
        self.eos_id = self._single_id(eos_text)
        probe = self.tokenize("a", add_special=False, parse_special=False)
        with_special = self.tokenize("a", add_special=True, parse_special=False)
        self.add_bos = len(with_special) > len(probe) and with_special[0] == self.bos_id

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        body = {"content": text, "add_special": add_special, "parse_special": parse_special}
        tokens = self._client.post_json("/tokenize", body).get("tokens")
        if not isinstance(tokens, list):
            raise RemoteEngineError(f"{self._client.base_url}/tokenize answered without tokens; is it llama-server?")
        return [int(token) if not isinstance(token, dict) else int(token["id"]) for token in tokens]

    def detokenize(self, tokens: list[int]) -> str:
        return str(self._client.post_json("/detokenize", {"tokens": tokens}).get("content", ""))

    def _single_id(self, text: str) -> int:
        if not text:
            return -1
        tokens = self.tokenize(text, add_special=False, parse_special=True)
        return tokens[0] if len(tokens) == 1 else -1


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
            raise RemoteEngineError(f"{self.base_url}{path} did not answer with JSON; is it llama-server?") from None
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
        if response.status_code == 404 and path in ("/props", "/tokenize"):
            raise RemoteEngineError(
                f"the server at {self.base_url} has no {path}: chatapp needs its tokenizer and template "
                "(llama-server or `chatapp serve`); check the address"
            )
        detail = _error_message(response)
        raise RemoteEngineError(
            f"the engine at {self.base_url} answered HTTP {response.status_code} on {path}: {detail}"
        )

    def network_error(self, error: httpx.HTTPError) -> RemoteEngineError:
        if isinstance(error, httpx.ConnectError):
            return RemoteEngineError(
                f"cannot reach the engine at {self.base_url} ({_reason(error)}); start the server or fix --backend"
            )
        if isinstance(error, httpx.TimeoutException):
            return RemoteEngineError(
                f"the engine at {self.base_url} did not answer in time ({type(error).__name__}); "
                "it may be busy or stopped: try again"
            )
        return RemoteEngineError(
            f"the connection to the engine at {self.base_url} broke ({_reason(error)}); what was received is kept: "
            "try again"
        )

    def close(self) -> None:
        self.http.close()


class RemoteEngine:
    """The engine contract over a llama-server-style API (llama-server, `chatapp serve`)."""

    def __init__(self, config: RemoteConfig) -> None:
        self._client = RemoteClient(config)
        try:
            props = self._client.get_json("/props")
            bos_text, eos_text = str(props.get("bos_token") or ""), str(props.get("eos_token") or "")
            self._vocabulary = RemoteVocabulary(self._client, bos_text, eos_text)
            template = ChatTemplate(str(props.get("chat_template") or FALLBACK_CHATML), bos_text, eos_text)
            self.prompt_builder = PromptBuilder(template, self._vocabulary)
        except BaseException:
            self._client.close()
            raise
        settings = props.get("default_generation_settings") or {}
        n_ctx = int(settings.get("n_ctx") or props.get("n_ctx") or 0)
        model_path = str(props.get("model_path") or "")
        name = config.model or model_path.rsplit("/", 1)[-1].removesuffix(".gguf") or "remote model"
        self.info = ModelInfo(
            path=None,
            name=name,
            description=f"{name} at {self._client.base_url}",
            n_ctx_train=n_ctx,
            n_ctx_per_sequence=n_ctx,
            n_sequences=int(props.get("total_slots") or 1),
            flash_attention=False,
            gpu_layers=0,
            threads=0,
            n_vocab=int(props.get("n_vocab") or 0),
            server=self._client.base_url,
            fingerprint=served_model_fingerprint(props),
        )
        self.capabilities = REMOTE_CAPABILITIES
        self.takes_checkpoints = False
        self.cache: PrefixCache | None = None
        self.cache_problem: str | None = None
        self.restore_costs: RestoreCosts | None = None
        self._running: set[_RemoteRequest] = set()
        self._lock = threading.Lock()
        self._closed = False

    def generate(self, request: GenerationRequest) -> GenerationHandle:
        if not request.prompt_tokens:
            raise ValueError("a generation request needs at least one prompt token")
        limit = self.info.n_ctx_per_sequence
        if limit and len(request.prompt_tokens) >= limit:
            raise ContextOverflowError(
                f"the prompt is {len(request.prompt_tokens):,} tokens but the server's context holds {limit:,} per "
                "conversation; shorten it or start the server with a larger context",
                prompt_tokens=len(request.prompt_tokens),
                context_tokens=limit,
            )
        with self._lock:
            if self._closed:
                raise RuntimeError("the engine is closed")
            running = _RemoteRequest(self, request)
            self._running.add(running)
            running.start()
        return running.handle

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        return self._vocabulary.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: list[int]) -> str:
        return self._vocabulary.detokenize(tokens)

    def flush_cache(self) -> None:
        """The server stores its own cache: nothing to wait for here."""

    def close(self) -> None:
        with self._lock:
            self._closed = True
            running = list(self._running)
        for request in running:
            request.handle.cancel()
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        for request in running:
            request.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._client.close()

    def _done(self, request: _RemoteRequest) -> None:
        with self._lock:
            self._running.discard(request)


class _CancellableHandle(GenerationHandle):
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


class _RemoteRequest:
    """One request on its own thread: the /completion stream turned into engine events.

    Text streams as it comes; the answer's token ids are known to be right only at the end (see
    `_verified_ids`), so they are in the result, not in the streamed events: an answer cut off
    midway keeps its text, never ids that may not spell it.
    """

    def __init__(self, engine: RemoteEngine, request: GenerationRequest) -> None:
        self.engine = engine
        self.handle = _CancellableHandle(request)
        self.thread = threading.Thread(target=self._run, name="chatapp-remote", daemon=True)
        self._tokens: list[int] = []
        self._pieces: list[str] = []
        self._started = time.perf_counter()
        self._first_text_at: float | None = None

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        try:
            self.handle.finish(self._stream())
        except BaseException as error:
            if self.handle.cancel_event.is_set():  # a stop asked for: whatever broke, it is a stop
                self.handle.finish(self._result(StopReason.CANCELLED, {}))
            elif isinstance(error, RemoteEngineError):
                self.handle.finish(None, error)
            elif isinstance(error, httpx.HTTPError):
                self.handle.finish(None, self.engine._client.network_error(error))
            else:  # a bug, or a reply of the wrong shape: the caller must not wait for ever
                log.exception("remote request failed")
                self.handle.finish(None, error)
        finally:
            self.engine._done(self)

    def _body(self) -> dict[str, Any]:
        request = self.handle.request
        sampling = request.sampling
        body: dict[str, Any] = {
            "prompt": list(request.prompt_tokens),
            "n_predict": 1 if request.prefill_only else sampling.max_tokens,
            "stream": True,
            "cache_prompt": request.use_cache,
            "return_tokens": True,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    def _stream(self) -> GenerationResult:
        handle = self.handle
        client = self.engine._client
        with client.http.stream("POST", "/completion", json=self._body()) as response:
            handle.response = response
            if response.status_code >= 400 and not handle.cancel_event.is_set():
                response.read()
                client.raise_for_status(response, "/completion")
            for chunk in _server_events(response):
                if handle.cancel_event.is_set():
                    break
                if "error" in chunk:
                    raise RemoteEngineError(f"the engine at {client.base_url} failed: {_error_text(chunk['error'])}")
                if chunk.get("stop"):
                    return self._finished(chunk)
                self._take(chunk)
        if handle.cancel_event.is_set():
            return self._result(StopReason.CANCELLED, {})
        raise RemoteEngineError(
            f"the engine at {client.base_url} ended the answer without its last message; "
            "what was received is kept: try again"
        )

    def _take(self, chunk: dict[str, Any]) -> None:
        """One streamed piece: its text goes out now, its ids are kept for the check at the end."""
        self._tokens.extend(int(token) for token in chunk.get("tokens") or ())
        text = str(chunk.get("content") or "")
        if text and not self.handle.request.prefill_only:
            if self._first_text_at is None:
                self._first_text_at = time.perf_counter()
            self._pieces.append(text)
            self.handle.emit(TokenText(text=text, token_id=-1))

    def _finished(self, final: dict[str, Any]) -> GenerationResult:
        self._take(final)
        if self.handle.request.prefill_only:
            return self._result(StopReason.PREFILLED, final)
        return self._result(STOP_REASONS.get(str(final.get("stop_type")), StopReason.END), final)

    def _result(self, reason: StopReason, final: dict[str, Any]) -> GenerationResult:
        """The result from the server's final report (`{}` when it never came: a cancel)."""
        ended = time.perf_counter()
        prompt_tokens = len(self.handle.request.prompt_tokens)
        timings = final.get("timings") or {}
        reused = max(0, min(int(timings.get("cache_n") or 0), prompt_tokens))
        tier = ReuseTier.SERVER if reused else ReuseTier.NONE
        if final:
            self.handle.emit(PromptPlaced(reused, prompt_tokens, tier))
        first = self._first_text_at if self._first_text_at is not None else ended
        stats = GenerationStats(
            prompt_tokens=prompt_tokens,
            reused_tokens=reused,
            computed_tokens=prompt_tokens - reused,
            reuse_tier=tier,
            generated_tokens=max(len(self._tokens), int(final.get("tokens_predicted") or 0)),
            ttft_ms=(first - self._started) * 1000,
            total_ms=(ended - self._started) * 1000,
            prefill_ms=float(timings.get("prompt_ms") or 0.0),
        )
        tokens = self._verified_ids(final) if final and reason is not StopReason.PREFILLED else ()
        return GenerationResult("".join(self._pieces), tokens, reason, stats)

    def _verified_ids(self, final: dict[str, Any]) -> tuple[int, ...]:
        """The answer's token ids, only when they give back exactly its text; else () (the text is tokenized).

        llama-server sends the end-of-generation token's id (no text) and may leave out the id of a
        token that ends inside a character: ids that do not spell the answer would corrupt every
        later prompt, while tokenizing the text again only costs a cache miss after the answer.
        """
        ids = list(self._tokens)
        if final.get("stop_type") == "eos" and ids and ids[-1] == self.engine._vocabulary.eos_id:
            ids.pop()
        text = "".join(self._pieces)
        if not ids or not text:
            return ()
        if self.engine.detokenize(ids) != text:
            log.info("the server's token ids do not spell its answer: the answer's text will be tokenized")
            return ()
        return tuple(ids)


def served_model_fingerprint(props: dict[str, Any]) -> str:
    """A hash of what the server says of its model: another model, template or vocabulary, another hash.

    Answers' token ids remembered for one served model must never be sent for another.
    """
    identity = [props.get(key) for key in ("model_path", "chat_template", "bos_token", "eos_token", "n_vocab")]
    return xxhash.xxh3_64_hexdigest(json.dumps(identity, ensure_ascii=False, sort_keys=True).encode("utf-8"))


def _server_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
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


def _error_message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return _one_line(response.text) or response.reason_phrase
    return _error_text(data.get("error", data) if isinstance(data, dict) else data)


def _error_text(error: object) -> str:
    if isinstance(error, dict):
        return _one_line(str(error.get("message") or error))
    return _one_line(str(error))


def _one_line(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]


def _reason(error: httpx.HTTPError) -> str:
    return _one_line(str(error), 160) or type(error).__name__
