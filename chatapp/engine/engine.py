"""The engine: one llama.cpp context, owned by one thread, serving generation requests.

The UI and the CLI never touch llama.cpp. They submit a `GenerationRequest` and read
events from its `GenerationHandle` (prefill progress, token text), which they may cancel
at any time; the engine thread does all model work, so a long prefill never blocks them.

Several answers run together, each on its own sequence: in each turn the engine thread
takes one step of every answer being streamed (a token) and of one prompt being computed
(a batch; turns.py says which, and when a request waits for another's prompt), so one
client's long prompt does not hold another's stream for its whole length. Each request is
still computed in the batches it would get alone. Work for later (warm-ups, an answer's recompute) runs only
when no answer does, and an answer waits while a warm-up finishes (it is usually that
answer's own prefix) or a stopped request clears its sequence.

For a model whose state cannot be cut (a sliding window, a recurrent state) the prefill
also ends batches at checkpoint positions and keeps the uncuttable state there: for this
session's rewinds (kv_placement.py) and, where it is worth it, in the cache.
"""

from __future__ import annotations

import codecs
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cache.llama_state import read_sequence_state, write_sequence_state
from cache.prefix_cache import PrefixCache
from cache.selftest import verify_layout
from cache.state_format import MemoryLayout, StateFormatError
from chatapp.engine.batching import (
    FLASH_ATTENTION_ROWS,
    MIN_BATCH,
    MIN_ROWS,
    batch_end,
    stored_checkpoint_positions,
)
from chatapp.engine.events import (
    GenerationResult,
    GenerationStats,
    PrefillProgress,
    PromptPlaced,
    TokenText,
)
from chatapp.engine.gate import Step, StepGate
from chatapp.engine.handle import GenerationHandle
from chatapp.engine.kv_placement import KVPlacer, Placement
from chatapp.engine.llama_native import (
    DecodeAborted,
    NativeContext,
    NativeModel,
    NativeSampler,
    gpu_offload_supported,
)
from chatapp.engine.model_card import LOCAL_CAPABILITIES, Capabilities, ModelInfo
from chatapp.engine.prompt import PromptBuilder
from chatapp.engine.requests import GenerationRequest
from chatapp.engine.restore_costs import RestoreCosts
from chatapp.engine.turns import TurnState, take_turns
from chatapp.errors import ContextOverflowError
from chatapp.vocabulary import ReuseTier, StopReason

log = logging.getLogger(__name__)

ALL_LAYERS = 999


def default_thread_count() -> int:
    """One thread per core: llama.cpp runs slower on hyper-threads than on cores."""
    logical = os.cpu_count() or 1
    return logical if logical <= 4 else max(4, logical // 2)


@dataclass(frozen=True)
class EngineConfig:
    """How to load the model and shape its context."""

    model_path: Path
    context_cap: int = 8192
    sequences: int = 4
    n_gpu_layers: int = -1  # -1: all layers when the build can offload, else none
    threads: int | None = None
    # On, every prompt batch has at least FLASH_ATTENTION_ROWS tokens (batching.py), which keeps
    # restores exact; off by default: each answer then computes 64 prompt tokens, not 2.
    flash_attention: bool = False
    n_batch: int = 512
    # Sliding-window models: a full-size window cache keeps every cell (cuts anywhere); off, about
    # one window per sequence (less memory; a cut behind the window rewinds to a checkpoint).
    swa_full: bool = True
    # Models with uncuttable state (sliding window, recurrent): a checkpoint every this many
    # prompt tokens, besides the prompt's end and the boundaries a request names.
    checkpoint_interval: int = 1024
    # Plain KV caches: the newest whole sequence states kept ready to load (cache/ready_states.py).
    ready_state_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        if self.n_batch < MIN_BATCH:
            # batch_end never leaves one token alone, which needs room for three in a batch.
            raise ValueError(f"n_batch must be at least {MIN_BATCH}, got {self.n_batch}")
        if self.flash_attention and self.n_batch < 2 * FLASH_ATTENTION_ROWS:
            # Every batch has FLASH_ATTENTION_ROWS tokens or more, and none leaves fewer behind.
            raise ValueError(
                f"with flash attention n_batch must be at least {2 * FLASH_ATTENTION_ROWS}, got {self.n_batch}"
            )


CacheFactory = Callable[[MemoryLayout, ModelInfo], PrefixCache]


class _Task:
    """A started request on the engine thread: its steps, its sequence, and what it runs now."""

    def __init__(self, handle: GenerationHandle) -> None:
        self.handle = handle
        self.current = handle  # the request a step runs: the answer, then its recompute
        self.sequence: int | None = None  # once placed
        self.after_answer = False  # the caller has its result; what is left is the engine's own work
        self.steps: Iterator[None] = iter(())
        request = handle.request
        self.turn = TurnState(np.asarray(request.prompt_tokens, dtype=np.int32), request.use_cache and request.store)


class Engine:
    """Loads a model, owns its context on a private thread, and runs requests in order."""

    def __init__(self, config: EngineConfig, cache_factory: CacheFactory | None = None) -> None:
        self.config = config
        self._cache_factory = cache_factory
        self.cache: PrefixCache | None = None
        self.cache_problem: str | None = None
        self._jobs: queue.Queue[GenerationHandle | threading.Event | None] = queue.Queue()
        self._loaded = threading.Event()
        self._load_error: BaseException | None = None
        self._active: GenerationHandle | None = None  # the request whose step runs now (for the abort check)
        self._closing = False
        self._closing_lock = threading.Lock()  # also guards the two fields below
        self._waiting_requests = 0  # generation requests submitted and not yet started by the engine thread
        self._rebatch_job: GenerationHandle | None = None  # the answer recompute running now, if any
        # Engine thread only.
        self._tasks: list[_Task] = []  # requests started and not yet done, in turn order
        self._short_first_batch: set[int] = set()  # sequences whose first batch had fewer than min_rows tokens
        self._pending: deque[GenerationHandle] = deque()  # taken from the queue, not yet started
        self._barriers: list[tuple[threading.Event, set[int]]] = []  # flush_cache() waits: ids of requests ahead
        # Tests only (see holding()): armed gates, each with the requests it counts (None: all).
        self._gates: tuple[tuple[StepGate, Callable[[GenerationRequest], bool] | None], ...] = ()
        self._thread = threading.Thread(target=self._run, name="chatapp-engine", daemon=True)
        self._thread.start()
        if (error := self._wait_until_loaded()) is not None:
            self._thread.join()
            raise error

    def _wait_until_loaded(self) -> BaseException | None:
        """Block until the engine thread has loaded the model; the error if it could not."""
        self._loaded.wait()
        return self._load_error

    # Public API, safe from any thread.
    def generate(self, request: GenerationRequest) -> GenerationHandle:
        """Queue a request; its prompt must fit in one sequence's context."""
        if not request.prompt_tokens:
            raise ValueError("a generation request needs at least one prompt token")
        if request.sequence is not None and not 0 <= request.sequence < self.info.n_sequences:
            raise ValueError(f"sequence {request.sequence} is outside 0..{self.info.n_sequences - 1}")
        limit = self.info.n_ctx_per_sequence
        if len(request.prompt_tokens) >= limit:
            raise ContextOverflowError(
                f"the prompt is {len(request.prompt_tokens):,} tokens but a conversation's context holds "
                f"{limit:,}; shorten it or use a larger --context (the model was trained on {self.info.n_ctx_train:,})",
                prompt_tokens=len(request.prompt_tokens),
                context_tokens=limit,
            )
        handle = GenerationHandle(request)
        with self._closing_lock:
            if self._closing:
                raise RuntimeError("the engine is closed")
            self._waiting_requests += 1
            self._jobs.put(handle)
            rebatch = self._rebatch_job
        if rebatch is not None:
            rebatch.cancel()  # a request comes before the recompute of the last answer
        return handle

    def flush_cache(self) -> None:
        """Wait until every answer so far has been handed to the cache and stored.

        Answers are stored after their caller is told they are done, so that storing never
        delays a reply; this waits for the engine thread to get there, then for the writer.
        """
        reached = threading.Event()
        with self._closing_lock:
            if self._closing:
                return
            self._jobs.put(reached)
        reached.wait()
        if self.cache is not None:
            self.cache.flush()

    @contextmanager
    def holding(
        self, step: Step, after: int, where: Callable[[GenerationRequest], bool] | None = None
    ) -> Iterator[StepGate]:
        """For tests: hold the engine thread right after the `after`-th step of that kind (see gate.py),
        counting only the requests `where` accepts.

        Inside the block the gate holds once, until released or the held request is cancelled;
        leaving the block releases it and disarms it. Several gates may be armed at once.
        """
        gate = StepGate(step, after)
        self._gates = (*self._gates, (gate, where))
        try:
            yield gate
        finally:
            gate.release()
            self._gates = tuple(armed for armed in self._gates if armed[0] is not gate)

    @property
    def min_rows(self) -> int:
        """The fewest tokens in a prompt batch (see batching.py): more with flash attention (if it attends)."""
        attends = self.model.memory_kind.has_base
        return FLASH_ATTENTION_ROWS if self.context.shape.flash_attention and attends else MIN_ROWS

    @property
    def restore_costs(self) -> RestoreCosts:
        """The measured speeds behind each choice between restoring a hit and computing it."""
        return self.placer.costs

    @property
    def capabilities(self) -> Capabilities:
        return LOCAL_CAPABILITIES

    def drop_ready_states(self) -> None:
        """For the bench: forget the whole states kept ready (thread-safe; call while idle)."""
        self.placer.ready.clear()

    @property
    def takes_checkpoints(self) -> bool:
        """Whether this model's state is checkpointed (so requests should name their boundaries)."""
        return self.placer.takes_checkpoints

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        return self.model.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: list[int]) -> str:
        return self.model.detokenize(tokens)

    def close(self) -> None:
        """Cancel what is running or queued, stop the thread and free the model."""
        with self._closing_lock:
            if self._closing:
                return
            self._closing = True
            self._jobs.put(None)
        active = self._active
        if active is not None:
            active.cancel()
        self._thread.join()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # Engine thread.
    def _run(self) -> None:
        try:
            self._load()
        except BaseException as error:  # reported to the constructor's caller
            self._load_error = error
            self._loaded.set()
            return
        self._loaded.set()
        try:
            closing = False
            while not closing or self._tasks:
                if not closing:
                    closing = not self._take_jobs(block=not self._tasks and not self._pending)
                if closing:
                    self._end_pending()
                    for task in self._tasks:
                        task.current.cancel()
                self._start_tasks()
                self._step_tasks()
        except BaseException as error:  # a bug: no caller may wait for ever on a dead engine
            log.exception("the engine thread failed")
            self._fail_everything(error)
        finally:
            if self.cache is not None:
                self.cache.close()
            self.context.close()
            self.model.close()

    def _take_jobs(self, *, block: bool) -> bool:
        """Move what was submitted into `_pending` (waiting for one when `block`); False once closing."""
        job: GenerationHandle | threading.Event | None
        try:
            job = self._jobs.get(block=block)
        except queue.Empty:
            return True
        while True:
            if job is None:
                return False
            if isinstance(job, threading.Event):  # a flush_cache() barrier: it waits for every request ahead
                ahead = {id(task.handle) for task in self._tasks} | {id(handle) for handle in self._pending}
                self._barriers.append((job, ahead))
                self._release_barriers()
            else:
                self._pending.append(job)
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return True

    def _fail_everything(self, error: BaseException) -> None:
        """The engine thread is ending on a bug: refuse new requests, end every one held, release every wait."""
        with self._closing_lock:
            self._closing = True
        while True:  # what was submitted and not yet taken
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, GenerationHandle):
                self._pending.append(job)
            elif isinstance(job, threading.Event):
                job.set()
        for handle in [*(task.handle for task in self._tasks), *self._pending]:
            if not handle.done:
                handle.finish(None, error)
        self._tasks.clear()
        self._pending.clear()
        for barrier, _ in self._barriers:
            barrier.set()
        self._barriers.clear()

    def _end_pending(self) -> None:
        """Closing: what never started ends at once, as cancelled."""
        while self._pending:
            handle = self._pending.popleft()
            with self._closing_lock:
                self._waiting_requests -= 1
            handle.cancel()
            handle.finish(self._untouched_result(handle))
            self._task_done(handle)

    def _start_tasks(self) -> None:
        """Start the waiting requests that may run now, in the order they came.

        One cancelled while it waited ends at once, wherever it is in the queue: it touches no
        sequence, and must not hold up the others (nor count as a request waiting).
        """
        for handle in [handle for handle in self._pending if handle.cancel_event.is_set()]:
            self._pending.remove(handle)
            with self._closing_lock:
                self._waiting_requests -= 1
            handle.finish(self._untouched_result(handle))
            self._task_done(handle)
        while self._pending and self._may_start(self._pending[0].request):
            handle = self._pending.popleft()
            with self._closing_lock:
                self._waiting_requests -= 1
            task = _Task(handle)
            task.turn.shares_prompt &= self.cache is not None  # without a cache nothing is worth waiting for
            task.steps = self._serve(task)
            self._tasks.append(task)

    def _may_start(self, request: GenerationRequest) -> bool:
        """Whether `request` may start beside the running tasks (see the module docstring)."""
        if not self._tasks:
            return True
        if len(self._tasks) >= self.info.n_sequences or request.prefill_only:
            return False  # a warm-up is work for when no answer runs
        ready = True
        for task in self._tasks:
            if task.after_answer:
                task.current.cancel()  # an answer's recompute gives way to a request, as when it arrives
                ready = False
            elif task.handle.request.prefill_only or task.current.cancel_event.is_set():
                ready = False  # a warm-up finishing (likely this request's prefix), or a stop clearing its sequence
            elif request.sequence is not None and task.sequence in (None, request.sequence):
                ready = False  # that sequence is in use, or may be once this task is placed
        return ready

    def _step_tasks(self) -> None:
        """One step of each task whose turn it is (see turns.py); a cancelled one ends at once."""
        stopping = [task for task in self._tasks if task.current.cancel_event.is_set()]
        running = [task for task in self._tasks if task not in stopping]
        chosen = {id(state) for state in take_turns([task.turn for task in running], self.context.shape.n_batch)}
        for task in [task for task in self._tasks if task in stopping or id(task.turn) in chosen]:
            self._active = task.current
            try:
                next(task.steps)
            except StopIteration:
                self._tasks.remove(task)
                self._task_done(task.handle)
            except BaseException as error:  # _serve handles its own failures: this is a bug, not a request's end
                log.exception("engine task failed")
                self._tasks.remove(task)
                if task.sequence is not None:
                    self.placer.forget(task.sequence)
                    self._short_first_batch.discard(task.sequence)
                if not task.handle.done:
                    task.handle.finish(None, error)
                self._task_done(task.handle)
            finally:
                self._active = None

    def _task_done(self, handle: GenerationHandle) -> None:
        for _, ahead in self._barriers:
            ahead.discard(id(handle))
        self._release_barriers()

    def _release_barriers(self) -> None:
        for barrier, ahead in list(self._barriers):
            if not ahead:
                barrier.set()
                self._barriers.remove((barrier, ahead))

    def _busy_sequences(self, besides: _Task) -> frozenset[int]:
        """The sequences other tasks use, or will (a request that names one and waits to be placed)."""
        others = (task for task in self._tasks if task is not besides)
        used = (task.sequence if task.sequence is not None else task.handle.request.sequence for task in others)
        return frozenset(sequence for sequence in used if sequence is not None)

    def _load(self) -> None:
        config = self.config
        layers = config.n_gpu_layers
        if layers < 0:
            layers = ALL_LAYERS if gpu_offload_supported() else 0
        self.model = NativeModel(config.model_path, n_gpu_layers=layers)
        threads = config.threads or default_thread_count()
        per_sequence = min(self.model.n_ctx_train or config.context_cap, config.context_cap)
        try:
            self.context = NativeContext(
                self.model,
                n_sequences=config.sequences,
                n_ctx_per_sequence=per_sequence,
                n_threads=threads,
                n_batch=config.n_batch,
                flash_attention=config.flash_attention,
                swa_full=config.swa_full,
                should_abort=self._active_request_cancelled,
            )
        except BaseException:
            self.model.close()
            raise
        shape = self.context.shape
        self.info = ModelInfo(
            path=config.model_path,
            name=self.model.metadata("general.name") or config.model_path.stem,
            description=self.model.description(),
            n_ctx_train=self.model.n_ctx_train,
            n_ctx_per_sequence=shape.n_ctx_per_sequence,
            n_sequences=shape.n_sequences,
            flash_attention=shape.flash_attention,
            gpu_layers=min(layers, self.model.n_layer + 1),
            threads=threads,
            memory_kind=self.model.memory_kind,
            window=self.model.window,
            swa_full=shape.swa_full,
            n_vocab=self.model.n_vocab,
        )
        self.prompt_builder = PromptBuilder.for_model(self.model)
        self.layout = self._verify_state_format()
        if self._cache_factory is not None and self.layout is not None:
            self.cache = self._cache_factory(self.layout, self.info)
        self.placer = KVPlacer(
            self.context,
            self.cache,
            self.model.memory_kind,
            self.layout,
            window=self.model.window,
            # Whole states are a RAM restore too: never more than the RAM tier may hold.
            ready_state_bytes=min(config.ready_state_bytes, self.cache.config.ram_budget_bytes) if self.cache else 0,
            min_rows=self.min_rows,
        )

    def _verify_state_format(self) -> MemoryLayout | None:
        """Verify the state format on a few real tokens; None (and `cache_problem`) when it fails.

        Without a verified layout there is no cache, and no rewind of an uncuttable sequence.
        """
        probe = self.model.tokenize(
            "chatapp cache self-test: the quick brown fox", add_special=False, parse_special=False
        )
        source, target = 0, min(1, self.info.n_sequences - 1)
        kind = self.model.memory_kind
        try:
            batch = self.context.shape.n_batch
            for start in range(0, len(probe), batch):
                self.context.decode(
                    probe[start : start + batch], start_pos=start, sequence=source, logits_for_last=False
                )
            state = read_sequence_state(self.context.pointer, source)
            partial = (
                read_sequence_state(self.context.pointer, source, partial=True) if kind.needs_checkpoints else None
            )
            self.context.remove(source, 0, -1)

            def restore_and_read_back(moved: np.ndarray) -> np.ndarray | None:
                if not write_sequence_state(self.context.pointer, target, moved):
                    return None
                return read_sequence_state(self.context.pointer, target)

            return verify_layout(kind, self.model.window, state, partial, source, target, restore_and_read_back)
        except (StateFormatError, RuntimeError) as error:
            self.cache_problem = f"KV cache disabled: this llama.cpp's state format failed the self-test ({error})"
            log.warning(self.cache_problem)
            return None
        finally:
            self.context.remove(source, 0, -1)
            self.context.remove(target, 0, -1)

    def _reach(self, step: Step, handle: GenerationHandle) -> None:
        for gate, where in self._gates:
            if where is None or where(handle.request):
                gate.reached(step, handle.cancel_event)

    def _active_request_cancelled(self) -> bool:
        active = self._active
        return active is not None and active.cancel_event.is_set()

    def _serve(self, task: _Task) -> Iterator[None]:
        """A request from placement to the end of its answer, then the engine's own work after it.

        Yields between steps (see `_step_tasks`); failures end the request, never the engine.
        """
        handle = task.handle
        request = handle.request
        if handle.cancel_event.is_set():
            # Cancelled while queued (a warm-up whose draft was edited, a client that hung up):
            # it must not cut or evict any sequence on its way out.
            handle.finish(self._untouched_result(handle))
            return
        placement = None
        try:
            placement = self.placer.place(
                list(request.prompt_tokens),
                request.sequence,
                request.use_cache,
                need_logits=not request.prefill_only,
                busy=self._busy_sequences(task),
            )
            task.sequence = placement.sequence
            task.turn.placed = True
            task.turn.computing_from = placement.reused_tokens
            task.turn.prefill_left = len(request.prompt_tokens) - placement.reused_tokens
            handle.emit(PromptPlaced(placement.reused_tokens, len(request.prompt_tokens), placement.tier))
            result = yield from self._generate(task, placement)
        except Exception as error:
            # When in doubt, forget the sequence: a stale KV must never be reused.
            if placement is not None:
                self.placer.forget(placement.sequence)
                self._short_first_batch.discard(placement.sequence)
            handle.finish(None, error)
            return
        if request.use_cache and self.cache is not None and not request.prefill_only:
            # Counted before the caller hears of it (a warm-up is not a request the user made).
            self.cache.record_request(result.stats.prompt_tokens, result.stats.reused_tokens, result.stats.reuse_tier)
        handle.finish(result)
        task.after_answer = True
        if not request.prefill_only:
            yield from self._rebatch_answer(task, placement.sequence)
        if placement.sequence in self._short_first_batch:
            # Computed by other kernels than any longer prompt's first tokens: never reused.
            self._short_first_batch.discard(placement.sequence)
            self.placer.forget(placement.sequence)
            return
        if request.use_cache and self.cache is not None:
            if not request.store:
                return
            try:
                self.placer.save(placement.sequence)
            except (StateFormatError, RuntimeError) as error:
                log.warning("could not keep the KV of this answer: %s", error)

    def _rebatch_answer(self, task: _Task, sequence: int) -> Iterator[None]:
        """Compute the answer's tokens again, as one prefill, once the caller has the answer.

        Answer tokens were evaluated one at a time, and llama.cpp computes a one-token batch
        with other kernels than a longer one: a next turn continuing from that KV would not
        be the same computation as a cold run of its prompt (measured on the bundled model:
        6 of 8 follow-up answers differed). Redone in batches, the KV is what a cold run
        computes, for the next turn and for the cache. The caller already has its answer;
        it is work for the idle time while the user reads. A request that arrives first (or
        during it) comes first: the recompute stops, the sequence keeps the prompt and the
        batches already redone, and a later prompt that continues the answer computes the rest
        with its own prefill, as a cold run would. Cancelled by close() like any request.
        """
        answered = task.handle
        live = self.placer.resident.tokens[sequence]
        prompt_length = len(answered.request.prompt_tokens)
        if len(live) <= prompt_length:
            return
        job = GenerationHandle(
            GenerationRequest(tuple(live), answered.request.sampling, sequence=sequence, prefill_only=True)
        )
        task.current = job
        self._active = job
        with self._closing_lock:
            self._rebatch_job = job
            if self._waiting_requests or self._closing or len(self._tasks) > 1:
                job.cancel()
        # With flash attention the redone batch needs FLASH_ATTENTION_ROWS tokens: it starts in the prompt.
        redo_from = min(prompt_length, len(live) - self.min_rows)
        if sequence in self._short_first_batch:
            redo_from = min(redo_from, 0)  # its first batch too: a short one is never kept
        try:
            if redo_from < 0:
                return  # too short to compute in a batch of its own (_serve forgets it)
            if self.placer.cut(sequence, redo_from) == 0 and redo_from > 0:
                return
            yield from self._prefill(job, sequence, list(job.request.prompt_tokens), live, need_logits=False)
        except Exception as error:  # the answer is delivered; a failure here only costs reuse
            log.warning("could not recompute the answer's KV: %s", error)
            self.placer.forget(sequence)
        finally:
            with self._closing_lock:
                self._rebatch_job = None
            task.current = answered

    @staticmethod
    def _untouched_result(handle: GenerationHandle) -> GenerationResult:
        elapsed_ms = (time.perf_counter() - handle.submitted_at) * 1000
        prompt_tokens = len(handle.request.prompt_tokens)
        stats = GenerationStats(prompt_tokens, 0, prompt_tokens, ReuseTier.NONE, 0, elapsed_ms, elapsed_ms, 0.0)
        return GenerationResult(text="", token_ids=(), stop_reason=StopReason.CANCELLED, stats=stats)

    def _generate(self, task: _Task, placement: Placement) -> Generator[None, None, GenerationResult]:
        handle = task.handle
        request = handle.request
        prompt = list(request.prompt_tokens)
        sequence = placement.sequence
        live = self.placer.resident.tokens[sequence]
        reused = placement.reused_tokens
        prefill_started = time.perf_counter()
        stop_reason = yield from self._prefill(
            handle,
            sequence,
            prompt,
            live,
            need_logits=not request.prefill_only,
            checkpoints=self._checkpoint_positions(request),
            turn=task.turn,
        )
        prefill_ms = (time.perf_counter() - prefill_started) * 1000
        generated: list[int] = []
        pieces: list[str] = []
        first_token_at: float | None = None
        if stop_reason is None and request.prefill_only:
            stop_reason = StopReason.PREFILLED
        elif stop_reason is None:
            stop_reason, first_token_at = yield from self._decode_answer(handle, sequence, live, generated, pieces)
        finished_at = time.perf_counter()
        ttft_at = first_token_at if first_token_at is not None else finished_at
        stats = GenerationStats(
            prompt_tokens=len(prompt),
            reused_tokens=reused,
            computed_tokens=len(prompt) - reused,
            reuse_tier=placement.tier,
            generated_tokens=len(generated),
            ttft_ms=(ttft_at - handle.submitted_at) * 1000,
            total_ms=(finished_at - handle.submitted_at) * 1000,
            prefill_ms=prefill_ms,
            restore=placement.restore,
        )
        return GenerationResult(text="".join(pieces), token_ids=tuple(generated), stop_reason=stop_reason, stats=stats)

    def _prefill(
        self,
        handle: GenerationHandle,
        sequence: int,
        prompt: list[int],
        live: list[int],
        *,
        need_logits: bool = True,
        checkpoints: frozenset[int] = frozenset(),
        turn: TurnState | None = None,
    ) -> Generator[None, None, StopReason | None]:
        """Evaluate the prompt tokens not yet in `live`, in batches; StopReason.CANCELLED if cancelled.

        `live` grows by each batch once it is in the KV, so after a cancel it still lists
        exactly what the sequence holds and the next request reuses those batches. A batch
        also ends at each position in `checkpoints`, where the uncuttable state is kept.
        Other tasks take their steps between batches, not after the last: its logits are
        sampled before another sequence's decode replaces them.
        """
        batch = self.context.shape.n_batch
        rows = self.min_rows
        start = len(live)
        while start < len(prompt):
            if handle.cancel_event.is_set():
                return StopReason.CANCELLED
            end = batch_end(start, len(prompt), batch, checkpoints, rows)
            if end - start < rows and start > 0:
                # A short rest after what was reused (a warm-up's last word, typed one at a
                # time): evaluate it again with the tokens before it, so that later requests
                # build on KV computed by the kernels a cold run uses.
                start = self.placer.cut(sequence, max(0, end - rows))
                continue
            chunk = prompt[start:end]
            is_last = start + len(chunk) == len(prompt)
            decoding = time.perf_counter()
            try:
                self.context.decode(chunk, start_pos=start, sequence=sequence, logits_for_last=is_last and need_logits)
            except DecodeAborted:
                # llama.cpp may keep the micro-batches it finished: drop the whole batch (a recurrent
                # state updated in place by a stopped batch is rewound to a checkpoint).
                self.placer.recover(sequence, start)
                return StopReason.CANCELLED
            self.placer.costs.note_prefill(len(chunk), time.perf_counter() - decoding)
            if start == 0 and len(chunk) < rows:  # a whole prompt shorter than a batch may be: see _serve
                self._short_first_batch.add(sequence)
            elif start == 0:
                self._short_first_batch.discard(sequence)
            live.extend(chunk)
            start += len(chunk)
            if turn is not None:
                turn.prefill_left = len(prompt) - start
                self._store_if_awaited(turn, sequence, start, len(prompt))
            if start in checkpoints and sequence not in self._short_first_batch:
                self._take_checkpoint(handle, sequence, live)
            handle.emit(PrefillProgress(done=start, total=len(prompt)))
            if handle is not self._rebatch_job:  # the recompute after an answer is the engine's own work
                self._reach(Step.BATCH, handle)
            if not is_last:
                yield
        return None

    def _store_if_awaited(self, turn: TurnState, sequence: int, computed: int, length: int) -> None:
        """Store what is computed once a waiting request's shared tokens are (turns.py).

        A model whose state cannot be cut restores only at checkpoints: it stores at its prompt's end.
        """
        if not turn.store_at or sequence in self._short_first_batch:
            return
        if computed >= length or (computed >= turn.store_at and not self.placer.takes_checkpoints):
            self._store_for_waiting(sequence)
            turn.stored_until = computed
            turn.store_at = 0

    def _store_for_waiting(self, sequence: int) -> None:
        """Store a just-computed prompt now, for a request waiting to restore its beginning (turns.py).

        The engine waits for the cache's writer: each waiting request then restores what it
        would otherwise compute again, which takes far longer.
        """
        if self.cache is None:
            return
        try:
            self.placer.save(sequence)
            self.cache.flush()
        except (StateFormatError, RuntimeError) as error:
            log.warning("could not store a prompt another request waits for: %s", error)

    def _checkpoint_positions(self, request: GenerationRequest) -> frozenset[int]:
        """Where a prefill of `request` keeps the uncuttable state (empty for a plain KV cache).

        Each is kept for this session's rewinds, and stored in the cache unless the request
        says not to (a draft's warm-up, or one that bypasses the cache). A batch ends at each,
        with or without the cache: batches of other shapes round differently, and a prompt
        must be computed alike whether or not it was cached, so that an answer after a
        restore equals the answer of a run without the cache.
        """
        if not self.placer.takes_checkpoints:
            return frozenset()
        return frozenset(self._stored_checkpoints(request))

    def _stored_checkpoints(self, request: GenerationRequest) -> set[int]:
        """The checkpoints of `request` worth keeping beyond this session."""
        length = len(request.prompt_tokens)
        return stored_checkpoint_positions(
            length,
            request.checkpoints,
            self.config.checkpoint_interval,
            last=length if request.prefill_only else length - self.placer.fresh_tokens,
        )

    def _take_checkpoint(self, handle: GenerationHandle, sequence: int, live: list[int]) -> None:
        """Keep the uncuttable state at the end of `live`: for rewinds, and in the cache when allowed."""
        try:
            partial = read_sequence_state(self.context.pointer, sequence, partial=True)
        except StateFormatError as error:
            log.warning("cannot take a checkpoint: %s", error)
            return
        payload = self.placer.remember_checkpoint(sequence, len(live), partial)
        request = handle.request
        cache = self.cache if request.use_cache and request.store else None
        if cache is None or payload is None:
            return
        if not cache.has_checkpoint(live):
            cache.store_checkpoint(list(live), payload)

    def _decode_answer(
        self, handle: GenerationHandle, sequence: int, live: list[int], generated: list[int], pieces: list[str]
    ) -> Generator[None, None, tuple[StopReason, float | None]]:
        """Sample and evaluate answer tokens until a stop; returns the reason and first-token time.

        Other tasks take their steps after a token is handed out and before it is evaluated:
        a step evaluates a token and samples the next from its logits at once.
        """
        request = handle.request
        limit = self.context.shape.n_ctx_per_sequence
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        sampler = NativeSampler(request.sampling)
        first_token_at: float | None = None
        stop_reason = StopReason.CANCELLED
        try:
            while not handle.cancel_event.is_set():
                token = sampler.sample(self.context)
                if first_token_at is None:
                    first_token_at = time.perf_counter()
                if self.model.is_end_of_generation(token):
                    stop_reason = StopReason.END
                    break
                generated.append(token)
                text = decoder.decode(self.model.token_bytes(token))
                pieces.append(text)
                handle.emit(TokenText(text=text, token_id=token))
                self._reach(Step.TOKEN, handle)
                if len(generated) >= request.sampling.max_tokens:
                    stop_reason = StopReason.LENGTH
                    break
                if len(live) >= limit:
                    stop_reason = StopReason.CONTEXT
                    break
                yield
                if handle.cancel_event.is_set():
                    break
                # A single-token decode is not abortable (see NativeContext.decode): a stop is
                # seen between tokens, so `live` always lists exactly what the sequence holds.
                self.context.decode([token], start_pos=len(live), sequence=sequence, logits_for_last=True)
                live.append(token)
        finally:
            sampler.close()
            tail = decoder.decode(b"", final=True)
            if tail:
                pieces.append(tail)
                handle.emit(TokenText(text=tail, token_id=-1))
        return stop_reason, first_token_at
