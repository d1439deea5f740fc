"""The peers the benchmark compares: chatapp's engine and llama-cpp-python's own caches.

Every peer loads the same model with the same context, threads and batch size, answers
greedily (temperature 0), and reports what it computed. A peer is made by a factory that
takes the run's `PeerSettings` and a folder of its own; restarting a peer (workload E) is
closing it and calling the factory again with the same folder.

- `NoCachePeer`: a `Llama` reset before each request, so the whole prompt is computed.
  (`Llama` rather than chatapp's engine with `use_cache=False`: the engine recomputes each
  answer after delivering it, work a peer without any cache has no use for.)
- `LlamaPrefixPeer`: a `Llama` with no cache object: it reuses only the longest common
  prefix with what is live in its context (`Llama.generate`).
- `LlamaRAMCachePeer`: `Llama` + `LlamaRAMCache(capacity_bytes=ram budget)`.
- `LlamaDiskCachePeer`: `Llama` + `LlamaDiskCache` in the peer's folder (capacity: disk budget).
- `ChatappPeer`: chatapp's `Engine` with its tiered prefix cache in the peer's folder.

TTFT for `Llama` peers runs from the `create_completion` call to the first streamed chunk
(after the cache lookup and restore, before the cache save that follows the completion).
For chatapp it is the engine's own figure, from submission: it includes waiting for the
engine to finish recomputing the previous answer as one prefill (`Engine._rebatch_answer`),
since a request sent right after an answer waits for that too.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import llama_cpp

from cache.fingerprint import hash_file
from cache.prefix_cache import CacheConfig
from chatapp.engine.engine import Engine, EngineConfig, GenerationRequest
from chatapp.engine.llama_native import SamplingParams
from chatapp.services.startup import kv_cache_factory


@dataclass(frozen=True)
class PeerAnswer:
    text: str
    token_ids: tuple[int, ...] | None  # None when the peer cannot tell
    ttft_ms: float  # from sending the request to the first streamed token
    total_ms: float
    prompt_tokens: int
    computed_tokens: int  # prompt tokens the peer evaluated (not reused from its caches)


class Peer(Protocol):
    name: str

    def ask(self, prompt_tokens: Sequence[int], max_tokens: int) -> PeerAnswer: ...  # greedy

    def close(self) -> None: ...


@dataclass(frozen=True)
class PeerSettings:
    """What every peer shares: the model and how its context is shaped."""

    model_path: Path
    context: int = 4096  # tokens per conversation (per sequence for chatapp)
    threads: int = 2
    n_batch: int = 512
    ram_budget_bytes: int = 1 << 30
    disk_budget_bytes: int = 4 << 30
    chatapp_sequences: int = 2  # conversations resident in chatapp's context (its device tier)
    block_size: int = 64  # chatapp's cache block
    model_fingerprint: str | None = None  # computed once per run when None

    def fingerprint(self) -> str:
        return self.model_fingerprint or hash_file(self.model_path)


PeerFactory = Callable[[PeerSettings, Path], Peer]


# --------------------------------------------------------------------------------------------
# llama-cpp-python's Llama.


class _LlamaPeer:
    """A `Llama` answering greedily through `create_completion(stream=True)`."""

    name = "llama"

    def __init__(self, settings: PeerSettings, folder: Path) -> None:
        self.folder = folder
        with contextlib.redirect_stderr(io.StringIO()):
            self.llm = llama_cpp.Llama(
                model_path=str(settings.model_path),
                n_ctx=settings.context,
                n_batch=settings.n_batch,
                n_threads=settings.threads,
                n_threads_batch=settings.threads,
                flash_attn=False,  # as chatapp (its CPU flash attention is not batch-invariant)
                n_gpu_layers=0,
                verbose=False,
            )
        self._evaluated = 0
        original_eval = self.llm.eval

        def counting_eval(tokens: Sequence[int]) -> None:
            self._evaluated += len(tokens)
            return original_eval(tokens)

        self.llm.eval = counting_eval  # type: ignore[method-assign]
        cache = self.make_cache(settings, folder)
        if cache is not None:
            self.llm.set_cache(cache)

    def make_cache(self, settings: PeerSettings, folder: Path) -> llama_cpp.BaseLlamaCache | None:
        return None

    def before_request(self) -> None:
        pass

    def ask(self, prompt_tokens: Sequence[int], max_tokens: int) -> PeerAnswer:
        self.before_request()
        tokens = list(prompt_tokens)
        pieces: list[str] = []
        sink = io.StringIO()
        with contextlib.redirect_stderr(sink):  # LlamaDiskCache prints on every save
            started = time.perf_counter()
            self._evaluated = 0
            stream = self.llm.create_completion(
                tokens, max_tokens=max_tokens, temperature=0.0, top_k=1, repeat_penalty=1.0, stream=True
            )
            ttft_ms = None
            computed = 0
            for chunk in stream:
                if ttft_ms is None:
                    ttft_ms = (time.perf_counter() - started) * 1000
                    computed = self._evaluated  # the prompt's evals all come before the first token
                pieces.append(chunk["choices"][0]["text"])  # type: ignore[index]
            total_ms = (time.perf_counter() - started) * 1000
        if ttft_ms is None:  # nothing streamed (an immediate end of generation)
            ttft_ms, computed = total_ms, self._evaluated
        return PeerAnswer(
            text="".join(pieces),
            token_ids=None,
            ttft_ms=ttft_ms,
            total_ms=total_ms,
            prompt_tokens=len(tokens),
            computed_tokens=min(computed, len(tokens)),
        )

    def close(self) -> None:
        self.llm.set_cache(None)
        self.llm.close()


class NoCachePeer(_LlamaPeer):
    """Computes every prompt whole: the `Llama` forgets its context before each request."""

    name = "no-cache"

    def before_request(self) -> None:
        self.llm.reset()
        self.llm._ctx.kv_cache_clear()


class LlamaPrefixPeer(_LlamaPeer):
    """Reuses only the prefix live in its context (what `Llama.generate` does by itself)."""

    name = "llama-prefix"


class LlamaRAMCachePeer(_LlamaPeer):
    name = "llama-ram"

    def make_cache(self, settings: PeerSettings, folder: Path) -> llama_cpp.BaseLlamaCache | None:
        return llama_cpp.LlamaRAMCache(capacity_bytes=settings.ram_budget_bytes)


class LlamaDiskCachePeer(_LlamaPeer):
    name = "llama-disk"

    def make_cache(self, settings: PeerSettings, folder: Path) -> llama_cpp.BaseLlamaCache | None:
        return llama_cpp.LlamaDiskCache(cache_dir=str(folder / "llama-disk-cache"), capacity_bytes=settings.disk_budget_bytes)

    def close(self) -> None:
        cache = self.llm.cache
        super().close()
        if isinstance(cache, llama_cpp.LlamaDiskCache):
            cache.cache.close()


# --------------------------------------------------------------------------------------------
# chatapp.


class ChatappPeer:
    """chatapp's engine with its prefix cache (device, RAM and disk tiers) in the peer's folder."""

    name = "chatapp"

    def __init__(self, settings: PeerSettings, folder: Path) -> None:
        config = CacheConfig(
            block_size=settings.block_size,
            ram_budget_bytes=settings.ram_budget_bytes,
            disk_budget_bytes=settings.disk_budget_bytes,
            ttl_seconds=7 * 86400,
        )
        factory = kv_cache_factory(folder / "kv", settings.fingerprint(), config)
        self.engine = Engine(
            EngineConfig(
                model_path=settings.model_path,
                context_cap=settings.context,
                sequences=settings.chatapp_sequences,
                n_gpu_layers=0,
                threads=settings.threads,
                n_batch=settings.n_batch,
            ),
            factory,
        )
        if self.engine.cache is None:
            raise RuntimeError(f"chatapp's cache did not open: {self.engine.cache_problem}")

    def ask(self, prompt_tokens: Sequence[int], max_tokens: int) -> PeerAnswer:
        request = GenerationRequest(tuple(prompt_tokens), SamplingParams(temperature=0.0, max_tokens=max_tokens))
        result = self.engine.generate(request).wait()
        stats = result.stats
        return PeerAnswer(
            text=result.text,
            token_ids=result.token_ids,
            ttft_ms=stats.ttft_ms,
            total_ms=stats.total_ms,
            prompt_tokens=stats.prompt_tokens,
            computed_tokens=stats.computed_tokens,
        )

    def close(self) -> None:
        """Store what is pending (a restart keeps everything answered so far), then stop."""
        try:
            self.engine.flush_cache()
        finally:
            self.engine.close()


PEERS: dict[str, PeerFactory] = {
    "no-cache": NoCachePeer,
    "llama-prefix": LlamaPrefixPeer,
    "llama-ram": LlamaRAMCachePeer,
    "llama-disk": LlamaDiskCachePeer,
    "chatapp": ChatappPeer,
}
