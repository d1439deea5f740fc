"""A remote engine that takes chat messages: chatapp in front of vLLM, SGLang, Ollama or any OpenAI-style server.

Such a server keeps its tokenizer and chat template to itself, so prompts cannot be built as
tokens here: the conversation's messages go to `POST /v1/chat/completions` and the server
renders them. Its prefix cache still sees the same beginning for the same persona, document
and history, since the messages are the same; but an answer goes back as text, which the
server tokenizes again and may split otherwise than it generated it, so reuse may stop inside
an earlier answer: a miss, never a wrong answer. What the server reused is read from
`usage.prompt_tokens_details.cached_tokens` where it reports it (vLLM with
`--enable-prompt-tokens-details`, SGLang, `chatapp serve`); where it does not, nothing is claimed.
"""

from __future__ import annotations

from typing import Any

import xxhash

from chatapp.engine.events import GenerationResult
from chatapp.engine.handle import GenerationHandle
from chatapp.engine.model_card import Capabilities
from chatapp.engine.remote_http import HttpEngine, RemoteClient, RemoteEngineError, StreamedRequest, served_model_info
from chatapp.engine.requests import GenerationRequest
from chatapp.prompting.prompt import PromptBuilder
from chatapp.vocabulary import StopReason

CHAT_CAPABILITIES = Capabilities(generated_ids=False)
FINISH_REASONS = {"stop": StopReason.END, "length": StopReason.LENGTH}
CHAT_PATH = "/v1/chat/completions"


class RemoteChatEngine(HttpEngine):
    """The engine contract over an OpenAI-style chat API; the server builds every prompt."""

    prompt_builder: PromptBuilder | None = None  # the server's template and tokenizer are not here
    capabilities = CHAT_CAPABILITIES

    def __init__(self, client: RemoteClient) -> None:
        """Ask the server which models it serves; the client is this engine's from here on."""
        super().__init__(client)
        try:
            listed = client.get_json("/v1/models").get("data")
        except BaseException:
            client.close()
            raise
        entries = [entry for entry in listed or () if isinstance(entry, dict) and entry.get("id")]
        names = [str(entry["id"]) for entry in entries]
        wanted = client.config.model
        if wanted is not None and names and wanted not in names:
            client.close()
            raise RemoteEngineError(
                f"the server at {client.base_url} does not serve {wanted!r} (it serves {', '.join(names[:6])}); "
                "fix --backend-model (backend_model in config.toml)"
            )
        model = wanted or (names[0] if names else None)
        if model is None:
            client.close()
            raise RemoteEngineError(f"the server at {client.base_url} lists no model; name one with --backend-model")
        entry = next((entry for entry in entries if entry["id"] == model), {})
        n_ctx = int(entry.get("max_model_len") or entry.get("context_length") or 0)
        self.model = model
        self.info = served_model_info(
            model,
            f"{model} at {client.base_url} (chat messages; the server builds the prompts)",
            client.base_url,
            xxhash.xxh3_64_hexdigest(f"chat:{model}".encode()),
            n_ctx=n_ctx,
            n_sequences=1,
        )

    def generate(self, request: GenerationRequest) -> GenerationHandle:
        if not request.messages:
            raise ValueError("a chat engine needs the request's messages")
        return self.start_request(_ChatRequest, request)


class _ChatRequest(StreamedRequest):
    """One streamed chat completion turned into engine events (text only: the server sends no ids)."""

    engine: RemoteChatEngine

    def __init__(self, engine: RemoteChatEngine, request: GenerationRequest) -> None:
        super().__init__(engine, request)
        self._finish: str | None = None
        self._usage: dict[str, Any] = {}

    def _body(self) -> dict[str, Any]:
        return {
            "model": self.engine.model,
            "messages": [item for message in self.handle.request.messages for item in message.template_inputs()],
            "stream_options": {"include_usage": True},
            **self.sampling_fields("max_tokens"),
        }

    def stream(self) -> GenerationResult:
        with self.client.http.stream("POST", CHAT_PATH, json=self._body()) as response:
            finished = False
            for chunk in self.events_of(response, CHAT_PATH):
                finished = self._take(chunk) or finished
            if finished and not self.handle.cancel_event.is_set():
                return self._result(self._reason())
        return self.ended_early()

    def cancelled_result(self) -> GenerationResult:
        return self._result(StopReason.CANCELLED)

    def _take(self, chunk: dict[str, Any]) -> bool:
        """One streamed chunk; True once the answer's end (or its usage, sent last) has come."""
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            self.take_text(str((choice.get("delta") or {}).get("content") or ""))
            if choice.get("finish_reason"):
                self._finish = str(choice["finish_reason"])
        return self._finish is not None

    def _reason(self) -> StopReason:
        if self.handle.request.prefill_only:
            return StopReason.PREFILLED
        return FINISH_REASONS.get(self._finish or "", StopReason.END)

    def _result(self, reason: StopReason) -> GenerationResult:
        usage = self._usage
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        stats = self.stats(
            int(usage.get("prompt_tokens") or 0),
            int(cached) if cached is not None else (None if usage else 0),
            reported=bool(usage),
            generated=int(usage.get("completion_tokens") or len(self.pieces)),
        )
        return GenerationResult("".join(self.pieces), (), reason, stats)
