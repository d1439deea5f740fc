"""What `chatapp serve` runs on: the engine with its cache, the completion service, the model's name.

The server layer sees only this object: it asks for completions, the model's id and the
cache's figures, and closes it once on the way out (answers finished or cancelled, every
KV block handed to the cache written, the stores closed).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from chatapp.engine.contract import EngineClient, ModelFacts, ModelInfo, SamplingParams
from chatapp.errors import StoreError
from chatapp.prompting.grammar import Grammar
from chatapp.reasoning import Reasoning
from chatapp.services.answer_shape import FREE_TEXT, AnswerShape
from chatapp.services.completions import (
    ApiMessage,
    Completion,
    CompletionRequest,
    CompletionService,
    KeepHint,
    RequestError,
)
from chatapp.services.library import DATABASE_NAME
from chatapp.services.pins import PinKeeper, RequestPins
from chatapp.services.prompt_plan import builder_of
from chatapp.services.startup import Workspace, engine_notices
from chatapp.store.answer_ids import AnswerIdStore
from chatapp.store.database import open_database
from chatapp.store.pins import PinStore

log = logging.getLogger(__name__)

ANSWER_IDS_FOLDER = "api-answers"
MAX_ANSWER_TOKENS = 8192  # the longest answer a request may ask for


@dataclass(frozen=True)
class SamplingOptions:
    """Sampling a request asks for; None takes the settings file's value (for max_tokens, the server's default)."""

    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    top_k: int | None = None  # None or 0: no top-k cut
    ignore_eos: bool = False  # the end-of-generation tokens forbidden: the answer runs to its length


@dataclass(frozen=True)
class ServingOptions:
    """How `chatapp serve` answers, the same for every model it serves."""

    max_pending: int = 16
    max_tokens_limit: int = MAX_ANSWER_TOKENS
    default_max_tokens: int | None = None  # None: until the model ends the answer or the context is full
    sort_tools: bool = False
    keep_reasoning: bool = True
    # Claude Code's prompts as sent: its billing line and opening system messages where they come
    # (anthropic_fields.system_prompt); off, every new conversation reuses the instructions the ones before it
    # computed.
    prompts_as_sent: bool = False


@dataclass(frozen=True)
class ModelCard:
    """The served model as the APIs list it."""

    id: str
    name: str
    path: str
    fingerprint: str
    context_tokens: int
    created: int  # the model file's modification time (seconds)
    size_bytes: int
    facts: ModelFacts  # from the GGUF's metadata; empty behind a remote engine
    template: str  # the chat template prompts are built with ("" where the backend builds them)
    gpu_bytes: int  # the share of the weights offloaded to a GPU


def _gpu_bytes(info: ModelInfo, size_bytes: int) -> int:
    """Bytes of the weights on the GPU: the offloaded layers' share (llama.cpp counts the output layer as one)."""
    layers = info.facts.layers
    return size_bytes * min(info.gpu_layers, layers + 1) // (layers + 1) if layers else 0


class Serving:
    """The engine, its cache and the completion service, opened once for the server's life."""

    def __init__(
        self, workspace: Workspace, options: ServingOptions | None = None, answer_ids: AnswerIdStore | None = None
    ) -> None:
        """`answer_ids`: a store shared with other models' servings (closed by its owner), else one of its own."""
        self.workspace = workspace
        self.options = options = options or ServingOptions()
        # Tools offered in name order, whatever order a request lists them in: a client that
        # reorders its tools from one request to the next would otherwise break its own prefix.
        self.sort_tools = options.sort_tools
        self.max_tokens_limit = options.max_tokens_limit
        # What a request without max_tokens gets. None: the answer goes on until the model ends it
        # or the context is full, as OpenAI, Ollama and llama-server answer (not the chat screen's
        # `max_tokens` setting, which is the length of an answer in the app).
        self.default_max_tokens = options.default_max_tokens
        self.engine: EngineClient = workspace.open_engine(serves_many=True)
        try:
            location, fingerprint = workspace.model_identity(self.engine.info)
            self._owns_answer_ids = answer_ids is None
            if answer_ids is None:
                answers_dir = workspace.paths.private_dir(workspace.paths.cache_dir) / ANSWER_IDS_FOLDER
                answer_ids = AnswerIdStore(answers_dir)
            self.answer_ids = answer_ids
        except BaseException:
            self.engine.close()
            raise
        self._pin_database: sqlite3.Connection | None = None
        self.pins = self._request_pins()
        self.completions = CompletionService(
            self.engine,
            fingerprint,
            self.answer_ids,
            max_pending=options.max_pending,
            keep_reasoning=options.keep_reasoning,
            pins=self.pins,
        )
        info = self.engine.info
        if info.path is not None:
            stat = info.path.stat()
            created, size = int(stat.st_mtime), stat.st_size
        else:  # a model on a backend server: no file here
            created, size = int(time.time()), 0
        builder = self.engine.prompt_builder
        self.model = ModelCard(
            id=info.short_name,
            name=info.name,
            path=location,
            fingerprint=fingerprint,
            context_tokens=info.n_ctx_per_sequence,
            created=created,
            size_bytes=size,
            facts=info.facts,
            template=builder.template.source if builder is not None else "",
            gpu_bytes=_gpu_bytes(info, size),
        )
        self._closed = False

    def _request_pins(self) -> RequestPins | None:
        """Where the beginnings requests ask to keep are pinned: the model's cache, listed with the app's
        pins (the cache screen and `chatapp cache stats` show them). None without a local cache."""
        cache = self.engine.cache
        if cache is None:
            return None
        try:
            self._pin_database = open_database(self.workspace.paths.root / DATABASE_NAME)
        except StoreError as error:
            log.warning("requests' cache_control is ignored: %s", error)
            return None
        return RequestPins(PinKeeper(cache, PinStore(self._pin_database)), self.engine.flush_cache)

    @property
    def notices(self) -> list[str]:
        """How the backend is driven, why the cache is off or limited (printed at start-up)."""
        return engine_notices(self.engine)

    def sampling(self, options: SamplingOptions) -> SamplingParams:
        """The request's sampling, the settings file filling what it leaves out but its length;
        RequestError past the limit."""
        base = self.workspace.sampling()
        max_tokens = options.max_tokens if options.max_tokens is not None else self.default_max_tokens
        if max_tokens is not None and max_tokens > self.max_tokens_limit:
            raise RequestError(
                f"max_tokens is {max_tokens:,} but this server answers at most {self.max_tokens_limit:,} tokens",
                "max_tokens",
            )
        return SamplingParams(
            temperature=options.temperature if options.temperature is not None else base.temperature,
            top_p=options.top_p if options.top_p is not None else base.top_p,
            seed=options.seed if options.seed is not None else base.seed,
            max_tokens=max_tokens,
            top_k=options.top_k or 0,
            ignore_eos=options.ignore_eos,
        )

    def chat(
        self,
        messages: list[ApiMessage],
        options: SamplingOptions,
        stop: tuple[str, ...],
        shape: AnswerShape = FREE_TEXT,
        keep: tuple[KeepHint, ...] = (),
        reasoning: Reasoning | None = None,
    ) -> Completion:
        """Start a chat completion (queued behind the requests before it), shaped as asked (tools, JSON);
        `keep`: beginnings to pin (cache_control), `reasoning`: the model's reasoning switch if it has one."""
        if self.sort_tools:
            shape = shape.with_tools_by_name()
        request = CompletionRequest(
            sampling=self.sampling(options),
            messages=tuple(messages),
            stop=stop,
            shape=shape,
            keep=keep,
            reasoning=reasoning,
        )
        return self.completions.start(request)

    def count_chat(
        self, messages: list[ApiMessage], shape: AnswerShape = FREE_TEXT, reasoning: Reasoning | None = None
    ) -> int:
        """The prompt tokens `chat` would send for these messages and shape (nothing is computed)."""
        if self.sort_tools:
            shape = shape.with_tools_by_name()
        request = CompletionRequest(
            sampling=SamplingParams(), messages=tuple(messages), shape=shape, reasoning=reasoning
        )
        return self.completions.count_prompt(request)

    def complete(
        self, prompt: str | list[int], options: SamplingOptions, stop: tuple[str, ...], grammar: Grammar | None = None
    ) -> Completion:
        """Start a plain completion of `prompt`, text or token ids (no chat template), held to `grammar` if given
        (a chatapp in front of this server sends its tool calls' and formats' grammars so)."""
        given = prompt if isinstance(prompt, str) else tuple(prompt)
        sampling = replace(self.sampling(options), grammar=grammar)
        return self.completions.start(CompletionRequest(sampling=sampling, prompt=given, stop=stop))

    def for_model(self, model: Path) -> Serving:
        """Another model served as this one is (same settings, options and answer store)."""
        return Serving(self.workspace.with_model(model), self.options, self.answer_ids)

    def props(self) -> dict[str, Any]:
        """The model's template, special tokens and context, as llama-server's /props gives them.

        A chatapp in front of this server builds prompts from these, so they stay append-only.
        """
        info = self.engine.info
        template = builder_of(self.engine).template
        return {
            "chat_template": template.source,
            "bos_token": template.bos_token,
            "eos_token": template.eos_token,
            "default_generation_settings": {"n_ctx": info.n_ctx_per_sequence},
            "total_slots": info.n_sequences,
            "model_path": self.model.path,
            "n_vocab": info.n_vocab,
            "build_info": "chatapp serve",
        }

    def flush(self) -> None:
        """Wait until the engine has finished the work after every answer so far and the cache has stored it."""
        self.engine.flush_cache()

    def flash_attention(self) -> tuple[bool, str]:
        """Whether the model runs with flash attention, and why (for /metrics)."""
        info = self.engine.info
        return info.flash_attention, info.flash_attention_why or ("on" if info.flash_attention else "off")

    def cache_figures(self) -> dict[str, Any] | None:
        """The cache's counters now (None without a cache)."""
        cache = self.engine.cache
        return dict(cache.stats()) if cache is not None else None

    def close(self) -> None:
        """Cancel what runs, write what the cache holds, close the stores; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self.engine.flush_cache()
        finally:
            try:
                if self.pins is not None:
                    self.pins.close()  # the pins asked for so far made: their blocks are stored by now
            finally:
                if self._pin_database is not None:
                    self._pin_database.close()
            self.engine.close()
            if self._owns_answer_ids:
                self.answer_ids.close()
