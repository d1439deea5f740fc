"""A remote engine that takes token ids: chatapp in front of llama-server or another `chatapp serve`.

Prompts stay append-only across the wire: the server's own chat template and tokenizer
(`GET /props`, `POST /tokenize`) build the prompt here, message by message, and its token ids
go to `POST /completion`, so the server's prefix cache sees exactly the prefixes chatapp
would compute. The answer's token ids come back with it (`return_tokens`) and join the
conversation as generated. What the server reused is read from its report (`timings.cache_n`),
after the answer: the server says nothing about it before.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import xxhash

from chatapp.engine.events import GenerationResult
from chatapp.engine.handle import GenerationHandle
from chatapp.engine.model_card import Capabilities
from chatapp.engine.remote_http import (
    HttpEngine,
    RemoteClient,
    RemoteConfig,
    RemoteEngineError,
    StreamedRequest,
    served_model_info,
)
from chatapp.engine.requests import GenerationRequest
from chatapp.errors import ContextOverflowError
from chatapp.prompting.chat_template import FALLBACK_CHATML, ChatTemplate
from chatapp.prompting.prompt import PromptBuilder
from chatapp.vocabulary import StopReason

__all__ = ["RemoteConfig", "RemoteEngine", "RemoteEngineError", "served_model_fingerprint"]

log = logging.getLogger(__name__)

REMOTE_CAPABILITIES = Capabilities(generated_ids=True, grammars=True)
STOP_REASONS = {"eos": StopReason.END, "word": StopReason.STOP_STRING, "limit": StopReason.LENGTH}


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


class RemoteEngine(HttpEngine):
    """The engine contract over a llama-server-style API (llama-server, `chatapp serve`)."""

    def __init__(self, client: RemoteClient, props: dict[str, Any]) -> None:
        """`props`: the server's `GET /props` (read by the caller, which picks the mode).

        The client is this engine's from here on: closed with it, or at once if this fails.
        """
        super().__init__(client)
        try:
            bos_text, eos_text = str(props.get("bos_token") or ""), str(props.get("eos_token") or "")
            self._vocabulary = RemoteVocabulary(self.client, bos_text, eos_text)
            template = ChatTemplate(str(props.get("chat_template") or FALLBACK_CHATML), bos_text, eos_text)
            self.prompt_builder = PromptBuilder(template, self._vocabulary)
        except BaseException:
            self.client.close()
            raise
        settings = props.get("default_generation_settings") or {}
        n_ctx = int(settings.get("n_ctx") or props.get("n_ctx") or 0)
        model_path = str(props.get("model_path") or "")
        name = client.config.model or model_path.rsplit("/", 1)[-1].removesuffix(".gguf") or "remote model"
        self.info = served_model_info(
            name,
            f"{name} at {client.base_url}",
            client.base_url,
            served_model_fingerprint(props),
            n_ctx=n_ctx,
            n_sequences=int(props.get("total_slots") or 1),
            n_vocab=int(props.get("n_vocab") or 0),
        )
        self.capabilities = REMOTE_CAPABILITIES

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
        return self.start_request(_CompletionRequest, request)

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        return self._vocabulary.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: list[int]) -> str:
        return self._vocabulary.detokenize(tokens)


class _CompletionRequest(StreamedRequest):
    """One `/completion` stream turned into engine events.

    Text streams as it comes; the answer's token ids are known to be right only at the end (see
    `_verified_ids`), so they are in the result, not in the streamed events: an answer cut off
    midway keeps its text, never ids that may not spell it.
    """

    engine: RemoteEngine

    def __init__(self, engine: RemoteEngine, request: GenerationRequest) -> None:
        super().__init__(engine, request)
        self._tokens: list[int] = []

    def _body(self) -> dict[str, Any]:
        request = self.handle.request
        return {
            "prompt": list(request.prompt_tokens),
            "cache_prompt": request.use_cache,
            "return_tokens": True,
            **self.sampling_fields("n_predict"),
            **(request.sampling.grammar.server_fields() if request.sampling.grammar is not None else {}),
        }

    def stream(self) -> GenerationResult:
        with self.client.http.stream("POST", "/completion", json=self._body()) as response:
            for chunk in self.events_of(response, "/completion"):
                if chunk.get("stop"):
                    return self._finished(chunk)
                self._take(chunk)
        return self.ended_early()

    def cancelled_result(self) -> GenerationResult:
        return self._result(StopReason.CANCELLED, {})

    def _take(self, chunk: dict[str, Any]) -> None:
        """One streamed piece: its text goes out now, its ids are kept for the check at the end."""
        self._tokens.extend(int(token) for token in chunk.get("tokens") or ())
        self.take_text(str(chunk.get("content") or ""))

    def _finished(self, final: dict[str, Any]) -> GenerationResult:
        self._take(final)
        if self.handle.request.prefill_only:
            return self._result(StopReason.PREFILLED, final)
        return self._result(STOP_REASONS.get(str(final.get("stop_type")), StopReason.END), final)

    def _result(self, reason: StopReason, final: dict[str, Any]) -> GenerationResult:
        """The result from the server's final report (`{}` when it never came: a cancel)."""
        timings = final.get("timings") or {}
        stats = self.stats(
            len(self.handle.request.prompt_tokens),
            _reused(final, timings),
            reported=bool(final),
            generated=max(len(self._tokens), int(final.get("tokens_predicted") or 0)),
            prefill_ms=float(timings.get("prompt_ms") or 0.0),
        )
        tokens = self._verified_ids(final) if final and reason is not StopReason.PREFILLED else ()
        return GenerationResult("".join(self.pieces), tokens, reason, stats)

    def _verified_ids(self, final: dict[str, Any]) -> tuple[int, ...]:
        """The answer's token ids, only when they give back exactly its text; else () (the text is tokenized).

        llama-server sends the end-of-generation token's id (no text) and may leave out the id of a
        token that ends inside a character: ids that do not spell the answer would corrupt every
        later prompt, while tokenizing the text again only costs a cache miss after the answer.
        """
        ids = list(self._tokens)
        if final.get("stop_type") == "eos" and ids and ids[-1] == self.engine._vocabulary.eos_id:
            ids.pop()
        text = "".join(self.pieces)
        if not ids or not text:
            return ()
        if self.engine.detokenize(ids) != text:
            log.info("the server's token ids do not spell its answer: the answer's text will be tokenized")
            return ()
        return tuple(ids)


def _reused(final: dict[str, Any], timings: dict[str, Any]) -> int | None:
    """What the server reused: none before its report (a cancel), None when its report does not say."""
    if not final:
        return 0
    return int(timings["cache_n"]) if "cache_n" in timings else None


def served_model_fingerprint(props: dict[str, Any]) -> str:
    """A hash of what the server says of its model: another model, template or vocabulary, another hash.

    Answers' token ids remembered for one served model must never be sent for another.
    """
    identity = [props.get(key) for key in ("model_path", "chat_template", "bos_token", "eos_token", "n_vocab")]
    return xxhash.xxh3_64_hexdigest(json.dumps(identity, ensure_ascii=False, sort_keys=True).encode("utf-8"))
