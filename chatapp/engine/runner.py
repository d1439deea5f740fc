"""Running one request on the engine thread: place it, compute its prompt, stream its answer, store it.

Each request runs as a generator that yields between steps (a prompt batch, an answer token),
so the scheduler (scheduler.py) can interleave several; the prompt's batches are prefill.py's.
After the caller has its answer the runner does the engine's own work: it computes the
answer's KV again in batches and hands the sequence's new blocks to the cache.
"""

from __future__ import annotations

import codecs
import logging
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Protocol

from cache.restore_checks import ReusedPrompt
from cache.state_format import StateFormatError
from chatapp.engine.batching import on_grid
from chatapp.engine.device_turns import device_turn, on_a_device
from chatapp.engine.events import AnswerText, GenerationResult, GenerationStats, PromptReuse
from chatapp.engine.gate import ArmedGates, Step
from chatapp.engine.handle import GenerationHandle
from chatapp.engine.kv_placement import KVPlacer, Placement
from chatapp.engine.llama_native import build_name
from chatapp.engine.loading import LoadedModel
from chatapp.engine.phases import Phase
from chatapp.engine.prefill import Prefill
from chatapp.engine.requests import GenerationRequest
from chatapp.engine.sampling import NativeSampler
from chatapp.engine.sequences import LiveSequence
from chatapp.engine.tasks import AnswerToken, Task, TaskStep
from chatapp.vocabulary import ReuseTier, StopReason

log = logging.getLogger(__name__)


class OwnWork(Protocol):
    """The scheduler's side of the engine's own work (an answer's recompute), which gives way to requests."""

    def begin_own_work(self, job: GenerationHandle, *, deferrable: bool = False) -> None:
        """`job` starts; it is cancelled at once (or later) when a request comes first, and a `deferrable` one
        (a restore check) when a flush waits too."""
        ...

    def end_own_work(self) -> None: ...


def untouched_result(handle: GenerationHandle) -> GenerationResult:
    """The result of a request cancelled before it touched any sequence."""
    elapsed_ms = (time.perf_counter() - handle.submitted_at) * 1000
    prompt_tokens = len(handle.request.prompt_tokens)
    stats = GenerationStats(prompt_tokens, 0, prompt_tokens, ReuseTier.NONE, 0, elapsed_ms, elapsed_ms, 0.0)
    return GenerationResult(text="", token_ids=(), stop_reason=StopReason.CANCELLED, stats=stats)


class Runner:
    """Runs requests on the loaded model, one generator per request (see `serve`)."""

    def __init__(
        self, loaded: LoadedModel, placer: KVPlacer, checkpoint_interval: int, gates: ArmedGates, own_work: OwnWork
    ) -> None:
        self._loaded = loaded
        self.model = loaded.model
        self.context = loaded.context
        self.cache = loaded.cache
        self.placer = placer
        self.sequences = placer.sequences
        self._gates = gates
        self._own_work = own_work
        self._prefill = Prefill(
            loaded.context,
            loaded.cache,
            placer,
            min_rows=loaded.min_rows,
            checkpoint_interval=checkpoint_interval,
            gates=gates,
            grid=loaded.grid,
        )
        self.batched_decodes = 0  # decodes that evaluated several answers' tokens (tests, the bench)

    @contextmanager
    def device_step(self) -> Iterator[None]:
        """The device's turn for one turn of steps (device_turns.py), held until the device has done their
        work: a decode may return while it still runs there, and the next engine may not start meanwhile."""
        with device_turn():
            try:
                yield
            finally:
                if on_a_device():
                    self._loaded.context.synchronize()

    def close(self) -> None:
        """The engine thread ends: free what was loaded (after the cache's last writes)."""
        self._loaded.close()

    def serve(self, task: Task) -> Generator[TaskStep, None, None]:
        """A request from placement to the end of its answer, then the engine's own work after it.

        Yields between steps; failures end the request, never the engine.
        """
        handle = task.handle
        request = handle.request
        if handle.cancel_event.is_set():
            # Cancelled while queued (a warm-up whose draft was edited, a client that hung up):
            # it must not cut or evict any sequence on its way out.
            handle.finish(untouched_result(handle))
            return
        placement = None
        started = time.time()  # the request log orders it before what it stores while it runs
        try:
            placement = self.placer.place(
                list(request.prompt_tokens),
                request.sequence,
                request.use_cache,
                need_logits=not request.prefill_only,
                holder=handle,
            )
            task.phase = Phase.PREFILLING
            task.turn.computing_from = placement.reused_tokens
            task.turn.prefill_left = len(request.prompt_tokens) - placement.reused_tokens
            handle.emit(PromptReuse(placement.reused_tokens, len(request.prompt_tokens), placement.tier))
            result = yield from self._generate(task, placement)
        except Exception as error:
            # When in doubt, forget the sequence: a stale KV must never be reused.
            if placement is not None:
                self.placer.forget(placement.sequence)
            handle.finish(None, error)
            return
        if request.use_cache and self.cache is not None and not request.prefill_only:
            self._offer_for_check(request, result)
            # Counted before the caller hears of it (a warm-up is not a request the user made).
            self.cache.record_request(
                request.prompt_tokens,
                result.stats.reused_tokens,
                result.stats.reuse_tier,
                in_place=placement.in_place,
                limit=placement.cache_limit,
                prefill_ms=result.stats.prefill_ms,
                started=started,
            )
        handle.finish(result)
        live = self.sequences[placement.sequence]
        if not request.prefill_only:
            task.phase = Phase.RECOMPUTING
            yield from self._rebatch_answer(task, live)
        task.phase = Phase.STORING
        if live.short_first_batch:
            # Computed by other kernels than any longer prompt's first tokens: never reused.
            self.placer.forget(live.index)
            return
        if request.use_cache and request.store and self.cache is not None:
            try:
                self.placer.save(live.index)
            except (StateFormatError, RuntimeError) as error:
                log.warning("could not keep the KV of this answer: %s", error)
        if self.cache is not None and not request.prefill_only:
            task.phase = Phase.CHECKING
            yield from self._check_a_reuse(task)

    def _offer_for_check(self, request: GenerationRequest, result: GenerationResult) -> None:
        """A prompt answered with reused KV may be one the restore checks sample (cache/restore_checks.py)."""
        assert self.cache is not None
        stats = result.stats
        if stats.reused_tokens and stats.logits_digest:
            reused = ReusedPrompt(
                request.prompt_tokens, stats.reuse_tier.value, stats.reused_tokens, stats.logits_digest, build_name()
            )
            self.cache.checks.offer(reused)

    def _check_a_reuse(self, task: Task) -> Generator[TaskStep, None, None]:
        """Compute one sampled prompt again from nothing and hand its logits' digest to the checks: work for
        the idle time, which stops (the prompt stays sampled) when a request comes or a flush waits.

        It runs in the sequence unused for longest (an empty one first), which then holds that prompt as a cold
        run leaves it: the conversations resident in the others, the one just answered among them, stay.
        """
        assert self.cache is not None
        checks = self.cache.checks
        sampled = checks.next(build_name())
        if sampled is None:
            return
        if not len(sampled.tokens) < self.context.shape.n_ctx_per_sequence or max(sampled.tokens) >= self.model.n_vocab:
            checks.drop(sampled)  # another context's or vocabulary's: nothing to compare here
            return
        answered = task.current
        job = GenerationHandle(GenerationRequest(sampled.tokens, answered.request.sampling, use_cache=False))
        task.current = job
        self._own_work.begin_own_work(job, deferrable=True)
        checking: LiveSequence | None = None
        try:
            if job.cancel_event.is_set():
                return  # a request waits (or a flush): every sequence keeps what it holds, the prompt stays sampled
            checking = self.sequences[self.sequences.least_recently_used(task.handle)]
            checking.holder = task.handle  # released with the task's other sequences when it ends
            self.placer.forget(checking.index)
            stopped = yield from self._prefill.run(task, checking, list(sampled.tokens))
            if stopped is None and not job.cancel_event.is_set():
                checks.done(sampled, self.context.logits_digest())
            if checking.short_first_batch:  # computed by other kernels than a longer prompt's: never reused
                self.placer.forget(checking.index)
        except Exception as error:  # the caller has its answer; a failure costs this sample only
            log.warning("could not check a restored prompt: %s", error)
            checks.drop(sampled)
            if checking is not None:
                self.placer.forget(checking.index)
        finally:
            self._own_work.end_own_work()
            task.current = answered

    def evaluate_answers(self, tokens: list[AnswerToken]) -> None:
        """Evaluate answer tokens: one alone as always, several (of different sequences) in one decode.

        The scheduler groups several only where the model batches exactly (batch_rule.py), and
        resumes each task evaluated before any other decode (its logits row is read then).
        """
        if len(tokens) == 1:
            (pending,) = tokens
            position, sequence = pending.position, pending.sequence
            self.context.decode([pending.token], start_pos=position, sequence=sequence, logits_for_last=True)
            pending.row, pending.evaluated = -1, True
            return
        ordered = sorted(tokens, key=lambda pending: pending.sequence)  # consecutive ids share ubatches
        self.context.decode_answers([(pending.token, pending.position, pending.sequence) for pending in ordered])
        for row, pending in enumerate(ordered):
            pending.row, pending.evaluated = row, True
        self.batched_decodes += 1

    @property
    def batches_answers(self) -> bool:
        return self._loaded.batch_answers

    def _rebatch_answer(self, task: Task, live: LiveSequence) -> Generator[TaskStep, None, None]:
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
        tokens = live.tokens
        prompt_length = len(answered.request.prompt_tokens)
        grid = self._loaded.grid
        # On a grid only whole grid batches are reused: the answer's are redone, its partial rest is not.
        redone = on_grid(len(tokens), grid)
        if redone <= (live.reusable if grid else prompt_length):
            return
        job = GenerationHandle(
            GenerationRequest(tuple(tokens[:redone]), answered.request.sampling, sequence=live.index, prefill_only=True)
        )
        task.current = job
        self._own_work.begin_own_work(job)
        # With flash attention the redone batch needs FLASH_ATTENTION_ROWS tokens: it starts in the prompt.
        redo_from = min(prompt_length, len(tokens) - self._loaded.min_rows)
        if grid:  # from the last whole grid batch (the prompt's own last one was partial)
            redo_from = on_grid(min(redo_from, live.reusable), grid)
        if live.short_first_batch:
            redo_from = min(redo_from, 0)  # its first batch too: a short one is never kept
        try:
            if redo_from < 0:
                return  # too short to compute in a batch of its own (serve forgets it)
            if self.placer.cut(live.index, redo_from) == 0 and redo_from > 0:
                return
            yield from self._prefill.run(task, live, list(job.request.prompt_tokens), need_logits=False)
        except Exception as error:  # the answer is delivered; a failure here only costs reuse
            log.warning("could not recompute the answer's KV: %s", error)
            self.placer.forget(live.index)
        finally:
            self._own_work.end_own_work()
            task.current = answered

    def _generate(self, task: Task, placement: Placement) -> Generator[TaskStep, None, GenerationResult]:
        handle = task.handle
        request = handle.request
        prompt = list(request.prompt_tokens)
        live = self.sequences[placement.sequence]
        reused = placement.reused_tokens
        prefill_started = time.perf_counter()
        checkpoints = self._prefill.checkpoint_positions(request)
        stop_reason = yield from self._prefill.run(
            task, live, prompt, need_logits=not request.prefill_only, checkpoints=checkpoints
        )
        prefill_ms = (time.perf_counter() - prefill_started) * 1000
        generated: list[int] = []
        pieces: list[str] = []
        first_token_at: float | None = None
        digest = ""
        if stop_reason is None and request.prefill_only:
            stop_reason = StopReason.PREFILLED
        elif stop_reason is None:
            task.phase = Phase.DECODING
            digest = self.context.logits_digest()  # the prompt's last output, before any other decode
            stop_reason, first_token_at = yield from self._decode_answer(handle, live, generated, pieces)
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
            logits_digest=digest,
        )
        return GenerationResult(text="".join(pieces), token_ids=tuple(generated), stop_reason=stop_reason, stats=stats)

    def _decode_answer(
        self, handle: GenerationHandle, live: LiveSequence, generated: list[int], pieces: list[str]
    ) -> Generator[TaskStep, None, tuple[StopReason, float | None]]:
        """Sample answer tokens until a stop, each evaluated by the scheduler; returns the reason and
        first-token time.

        A token handed out is yielded (AnswerToken) for the scheduler to evaluate, alone or in one
        decode with other answers' tokens (evaluate_answers); resumed, the step samples the next
        from its row of that decode's logits at once, before any other decode. After the last
        token the step yields once more, so what follows (the recompute's decodes) never runs
        between a batch's decode and another member's sampling.
        """
        request = handle.request
        tokens = live.tokens
        limit = self.context.shape.n_ctx_per_sequence
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        sampler = NativeSampler(request.sampling, self.model)
        grammar = request.sampling.grammar
        shown = self.model.special_ids(grammar.preserved) if grammar is not None else frozenset()
        first_token_at: float | None = None
        stop_reason = StopReason.CANCELLED
        row = -1  # the prompt's last output, then each token's row in the decode that evaluated it
        try:
            while not handle.cancel_event.is_set():
                token = sampler.sample(self.context, row)
                if first_token_at is None:
                    first_token_at = time.perf_counter()
                if self.model.is_end_of_generation(token):
                    stop_reason = StopReason.END
                    break
                generated.append(token)
                text = decoder.decode(self.model.token_bytes(token, special=token in shown))
                pieces.append(text)
                handle.emit(AnswerText(text=text, token_id=token))
                self._gates.reach(Step.TOKEN, request, handle.cancel_event)
                if request.sampling.max_tokens is not None and len(generated) >= request.sampling.max_tokens:
                    stop_reason = StopReason.LENGTH
                    break
                if len(tokens) >= limit:
                    stop_reason = StopReason.CONTEXT
                    break
                # A single-token decode is not abortable (see NativeContext.decode): a stop is
                # seen between tokens, so the sequence's tokens always list exactly what it holds.
                pending = AnswerToken(token, len(tokens), live.index)
                yield pending
                if not pending.evaluated:
                    break
                tokens.append(token)
                row = pending.row
            yield None  # a turn's end after the last sampling (see above)
        finally:
            sampler.close()
            tail = decoder.decode(b"", final=True)
            if tail:
                pieces.append(tail)
                handle.emit(AnswerText(text=tail, token_id=-1))
        return stop_reason, first_token_at
