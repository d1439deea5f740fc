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
- `ChatappPeer`: chatapp's local engine with its tiered prefix cache in the peer's folder.
- `ChatappWarmAheadPeer`, `ChatappTypedPeer`: the same, plus what the app computes before
  Enter (the persona and document; then the question as it is typed). Only on workloads
  whose requests carry a `Draft` (C).
- In remote_peer.py, the same through the remote engine: `chatapp-remote` (a `chatapp serve`
  the bench starts) and `remote:URL` (a server already running).
- `IdealPeer`: the yardstick, not a cache: the longest prefix any cache could know is made
  live off the clock before each request.

Between requests of latency workloads the runner lets each peer `settle` (a user reads the
answer): a `Llama` saves to its cache inside the call; chatapp recomputes the answer as one
prefill (the engine's `_rebatch_answer`) and stores the new blocks after handing the answer over,
and `settle` waits for that. Throughput workloads go back to back: there chatapp's recompute
gives way to the next request. Wall time counts it all.

TTFT for `Llama` peers runs from the `create_completion` call to the first streamed chunk
(after the cache lookup and restore, before the cache save that follows the completion).
For chatapp it is the engine's own figure, from submission to the first sampled token.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, TypeVar

import llama_cpp

from cache.fingerprint import hash_file
from cache.keys import as_token_array, common_prefix_length
from cache.prefix_cache import CacheConfig
from chatapp.benchmark.workloads import Draft, Request
from chatapp.engine.contract import EngineClient, GenerationRequest, LocalEngine, SamplingParams
from chatapp.engine.opening import FRESH_TOKENS, EngineConfig, KvType, start_local_engine
from chatapp.prompting.planner import PromptPlan, PromptPlanner, settled_text
from chatapp.services.answer_run import AnswerRun
from chatapp.services.answer_start import AnswerStart
from chatapp.services.prompt_plan import TooLongWording, builder_of
from chatapp.services.startup import kv_cache_factory


@dataclass(frozen=True)
class PeerAnswer:
    text: str
    token_ids: tuple[int, ...] | None  # None when the peer cannot tell
    ttft_ms: float  # from sending the request to the first streamed token
    total_ms: float
    prompt_tokens: int
    computed_tokens: int  # prompt tokens the peer evaluated (not reused from its caches)
    answer_tokens: int | None = None  # tokens in the answer, where the peer says (servers' usage, timings)


class Peer(Protocol):
    name: str

    def prepare(self, request: Request) -> dict[str, float] | None:
        """Off the clock, before `ask`: what the peer does while the user types (most do nothing)."""

    def ask(self, prompt_tokens: Sequence[int], max_tokens: int) -> PeerAnswer: ...  # greedy

    def settle(self) -> None:
        """Off the clock, after `ask`: finish the work a peer does after answering (while the user reads)."""

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
    slots: int = 1  # llama-server's -np: requests it serves at once (F: one per client)
    block_size: int = 64  # chatapp's cache block
    kv_type: KvType = KvType.F16  # chatapp's KV cells (figure S measures each type; the peers share f16)
    gpu_layers: int = 0  # layers every peer offloads to a GPU (0: all on the CPU, as the figures compare)
    server_template: str | None = None  # llama-server's chat template instead of the model's (Workload's)
    model_fingerprint: str | None = None  # computed once per run when None

    def fingerprint(self) -> str:
        return self.model_fingerprint or hash_file(self.model_path)


class PeerFactory(Protocol):
    """A peer class, or anything that makes a peer from the settings and its folder and has a name."""

    @property
    def name(self) -> str: ...

    def __call__(self, settings: PeerSettings, folder: Path) -> Peer: ...


T = TypeVar("T")


# --------------------------------------------------------------------------------------------
# llama-cpp-python's Llama.


class _LlamaPeer:
    """A `Llama` answering greedily through `create_completion(stream=True)`, on a thread of its own.

    Every llama call runs on the peer's own thread, which ends when the peer closes. llama.cpp
    runs its CPU kernels on an OpenMP team that belongs to the calling thread and outlives the
    call; with the main thread's team still there, the chatapp engine's team made more OpenMP
    threads than cores, libgomp stopped spinning at barriers, and every op paid a sleep and
    wake-up (measured: a 28-token prefill 157 ms alone, 209-240 ms with a `Llama` used on the
    main thread earlier in the process). One team at a time keeps the peers comparable.
    """

    name = "llama"

    def __init__(self, settings: PeerSettings, folder: Path) -> None:
        self.folder = folder
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"bench-{self.name}")
        try:
            self._on_thread(self._open, settings, folder)
        except BaseException:
            self._thread.shutdown(wait=True)
            raise

    def _on_thread(self, function: Callable[..., T], *args: object) -> T:
        return self._thread.submit(function, *args).result()

    def _open(self, settings: PeerSettings, folder: Path) -> None:
        with contextlib.redirect_stderr(io.StringIO()):
            self.llm = llama_cpp.Llama(
                model_path=str(settings.model_path),
                n_ctx=settings.context,
                n_batch=settings.n_batch,
                n_threads=settings.threads,
                n_threads_batch=settings.threads,
                flash_attn=False,  # as chatapp runs by default
                n_gpu_layers=settings.gpu_layers,
                verbose=False,
            )
        self._evaluated = 0
        original_eval = self.llm.eval

        def counting_eval(tokens: Sequence[int]) -> None:
            self._evaluated += len(tokens)
            original_eval(tokens)

        self.llm.eval = counting_eval
        cache = self.make_cache(settings, folder)
        if cache is not None:
            self.llm.set_cache(cache)

    def prepare(self, request: Request) -> dict[str, float] | None:
        self._on_thread(self.make_live, request)
        return None

    def make_live(self, request: Request) -> None:
        """Off the clock, on the peer's thread: what the context should hold before `request` (nothing)."""

    def settle(self) -> None:
        """Nothing: a `Llama` saves to its cache inside `create_completion`, before it returns."""

    def make_cache(self, settings: PeerSettings, folder: Path) -> llama_cpp.BaseLlamaCache | None:
        return None

    def before_request(self) -> None:
        pass

    def ask(self, prompt_tokens: Sequence[int], max_tokens: int) -> PeerAnswer:
        return self._on_thread(self._ask, prompt_tokens, max_tokens)

    def _ask(self, prompt_tokens: Sequence[int], max_tokens: int) -> PeerAnswer:
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
                pieces.append(chunk["choices"][0]["text"])
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
        try:
            self._on_thread(self._close)
        finally:
            self._thread.shutdown(wait=True)

    def _close(self) -> None:
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


class IdealPeer(_LlamaPeer):
    """The yardstick: before each request, the longest prefix any cache could know is live.

    Off the clock, the context is made to hold `request.known_prefix` tokens (the prefix the
    request shares with an earlier one, or the persona and document a warm-ahead computes),
    evaluated cold from position 0; the request then computes only the rest. Nothing is
    restored, nothing is stored: the time left is the least any cache can give.
    """

    name = "ideal"

    def make_live(self, request: Request) -> None:
        known = max(0, min(request.known_prefix, len(request.tokens) - FRESH_TOKENS))
        held = common_prefix_length(
            as_token_array(self.llm.input_ids[: self.llm.n_tokens]), as_token_array(request.tokens[:known])
        )
        if held < known:
            self.llm.reset()
            if known:
                self.llm.eval(list(request.tokens[:known]))


class LlamaRAMCachePeer(_LlamaPeer):
    name = "llama-ram"

    def make_cache(self, settings: PeerSettings, folder: Path) -> llama_cpp.BaseLlamaCache | None:
        return llama_cpp.LlamaRAMCache(capacity_bytes=settings.ram_budget_bytes)


class LlamaDiskCachePeer(_LlamaPeer):
    name = "llama-disk"

    def make_cache(self, settings: PeerSettings, folder: Path) -> llama_cpp.BaseLlamaCache | None:
        return llama_cpp.LlamaDiskCache(
            cache_dir=str(folder / "llama-disk-cache"), capacity_bytes=settings.disk_budget_bytes
        )

    def _close(self) -> None:
        cache = self.llm.cache
        super()._close()
        if isinstance(cache, llama_cpp.LlamaDiskCache):
            cache.cache.close()


# --------------------------------------------------------------------------------------------
# chatapp.


def open_chatapp_engine(settings: PeerSettings, folder: Path) -> LocalEngine:
    """chatapp's engine in this process, with its prefix cache (device, RAM and disk tiers) in `folder`."""
    config = CacheConfig(
        block_size=settings.block_size,
        ram_budget_bytes=settings.ram_budget_bytes,
        disk_budget_bytes=settings.disk_budget_bytes,
        ttl_seconds=7 * 86400,
    )
    factory = kv_cache_factory(folder / "kv", settings.fingerprint(), config)
    engine = start_local_engine(_engine_config(settings), factory)
    if engine.cache is None:
        problem = engine.cache_problem
        engine.close()
        raise RuntimeError(f"chatapp's cache did not open: {problem}")
    return engine


def open_cold_engine(settings: PeerSettings) -> LocalEngine:
    """chatapp's engine in this process without a cache: every prompt computed from its first token."""
    return start_local_engine(_engine_config(settings))


def _engine_config(settings: PeerSettings) -> EngineConfig:
    return EngineConfig(
        model_path=settings.model_path,
        context_cap=settings.context,
        sequences=settings.chatapp_sequences,
        n_gpu_layers=settings.gpu_layers,
        threads=settings.threads,
        n_batch=settings.n_batch,
        kv_type=settings.kv_type,
    )


def close_engine(engine: EngineClient) -> None:
    """Store what is pending (a restart keeps everything answered so far), then stop."""
    try:
        engine.flush_cache()
    finally:
        engine.close()


TOO_LONG = TooLongWording("the workload's prompt", "run the bench with a larger --context")


class ChatappPeer:
    """chatapp's engine with its prefix cache (device, RAM and disk tiers) in the peer's folder."""

    name = "chatapp"
    serves_together = True  # several clients' requests run at once (F), each on its own sequence

    def __init__(self, settings: PeerSettings, folder: Path) -> None:
        self.engine = self.open_engine(settings, folder)
        self.answers = AnswerStart(self.engine)
        self._boundaries: dict[tuple[int, ...], tuple[int, ...]] = {}  # by prompt: clients prepare at once

    def open_engine(self, settings: PeerSettings, folder: Path) -> EngineClient:
        """The engine the requests go to: chatapp's own, in this process (remote_peer.py: a server's)."""
        return open_chatapp_engine(settings, folder)

    def ask(self, prompt_tokens: Sequence[int], max_tokens: int) -> PeerAnswer:
        """The answer as the app's pipeline runs it (prompt_plan.py, answer_run.py); the bench keeps its figures."""
        sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        prompt = tuple(prompt_tokens)
        plan = PromptPlan(prompt, self._boundaries.pop(prompt, ()))
        run = AnswerRun(self.answers.start(plan, sampling, TOO_LONG).handle)
        result = run.wait()
        stats = result.stats
        return PeerAnswer(  # in the fields' order
            result.text, result.token_ids, stats.ttft_ms, stats.total_ms, stats.prompt_tokens, stats.computed_tokens
        )

    def prepare(self, request: Request) -> dict[str, float] | None:
        """The request's boundaries, as the app names them (used by models whose state cannot be cut)."""
        if self.engine.takes_checkpoints:
            self._boundaries[request.tokens] = request.boundaries
        return None

    def settle(self) -> None:
        """Wait for the answer's recompute (the engine's `_rebatch_answer`) and the cache store it hands over."""
        self.engine.flush_cache()

    def close(self) -> None:
        close_engine(self.engine)


_WARM_UP = SamplingParams(temperature=0.0, max_tokens=1)  # prefill-only requests sample nothing
TYPING_CPS = 5.0  # goal C-typed: a question typed at 5 characters per second


class ChatappWarmAheadPeer(ChatappPeer):
    """chatapp with the app's warm-ahead: the persona and document computed before the question.

    As when a conversation with a document is opened: `prepare` runs the prefill-only request
    the chat service sends (the branch's prompt with an empty question), and waits for it.
    """

    name = "chatapp+warm"
    drafts_only = True  # run on workloads whose requests say how the app builds them

    def prepare(self, request: Request) -> dict[str, float] | None:
        super().prepare(request)
        if request.draft is None:
            return None
        started = time.perf_counter()
        self._warm(self._draft_tokens(request.draft, ""), store=True)
        self.settle()  # the store that follows runs while the user starts typing
        return {"warm_ahead_ms": (time.perf_counter() - started) * 1000}

    def _draft_tokens(self, draft: Draft, typed: str) -> list[int]:
        return PromptPlanner(builder_of(self.engine)).draft_tokens(draft.messages, draft.parts_before, typed)

    def _warm(self, tokens: Sequence[int], *, store: bool) -> float:
        """Run one warm-up to its end; its duration in ms."""
        started = time.perf_counter()
        self.engine.generate(GenerationRequest(tuple(tokens), _WARM_UP, prefill_only=True, store=store)).wait()
        return (time.perf_counter() - started) * 1000


class ChatappTypedPeer(ChatappWarmAheadPeer):
    """chatapp with warm-ahead and type-ahead: the question computed as it is typed.

    The question is typed at `TYPING_CPS` characters per second; each time its settled part
    changes (a word ends) the app warms the draft's prompt (`PromptPlanner.draft_tokens`, store=False).
    The warm-ups run here one after another for real; typing is simulated on a clock: warm-up
    i starts when its word is typed or when warm-up i-1 ends, whichever is later. What is still
    running when Enter is pressed (`typing_lag_ms`) is added to the measured TTFT.
    """

    name = "chatapp+typed"

    def __init__(self, settings: PeerSettings, folder: Path) -> None:
        super().__init__(settings, folder)
        self._lag_ms = 0.0

    def prepare(self, request: Request) -> dict[str, float] | None:
        self._lag_ms = 0.0
        figures = super().prepare(request)
        if request.draft is None or figures is None:
            return figures
        question = request.draft.question
        clock_ms = 0.0  # simulated: when the last warm-up ends, from the first keystroke
        settled = ""
        warm_ups = 0
        for end in range(1, len(question) + 1):
            draft = question[:end]
            if settled_text(draft) == settled:
                continue
            settled = settled_text(draft)
            typed_at_ms = end * 1000 / TYPING_CPS
            duration = self._warm(self._draft_tokens(request.draft, draft), store=False)
            clock_ms = max(clock_ms, typed_at_ms) + duration
            warm_ups += 1
        enter_ms = len(question) * 1000 / TYPING_CPS
        self._lag_ms = max(0.0, clock_ms - enter_ms)
        return {**figures, "warm_ups": warm_ups, "typing_s": enter_ms / 1000, "typing_lag_ms": self._lag_ms}

    def ask(self, prompt_tokens: Sequence[int], max_tokens: int) -> PeerAnswer:
        answer = super().ask(prompt_tokens, max_tokens)
        return replace(answer, ttft_ms=answer.ttft_ms + self._lag_ms, total_ms=answer.total_ms + self._lag_ms)


PEERS: dict[str, PeerFactory] = {
    "no-cache": NoCachePeer,
    "llama-prefix": LlamaPrefixPeer,
    "llama-ram": LlamaRAMCachePeer,
    "llama-disk": LlamaDiskCachePeer,
    "chatapp": ChatappPeer,
    "chatapp+warm": ChatappWarmAheadPeer,
    "chatapp+typed": ChatappTypedPeer,
    "ideal": IdealPeer,
}
