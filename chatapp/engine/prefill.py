"""Computing a prompt in batches, and what a prefill keeps on the way.

The batches end where a cold run's do (batching.py), so a prompt computed after a restore
is the same computation as without the cache. For a model whose state cannot be cut the
prefill also ends batches at checkpoint positions and keeps the uncuttable state there: for
this session's rewinds (kv_placement.py) and, where it is worth it, in the cache. When
another request waits for this prompt's beginning (turns.py) it is stored as soon as it is
computed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator

from cache.llama_state import read_sequence_state
from cache.prefix_cache import PrefixCache
from cache.state_format import StateFormatError
from chatapp.engine.batching import batch_end, on_grid, stored_checkpoint_positions
from chatapp.engine.events import PromptProgress
from chatapp.engine.gate import ArmedGates, Step
from chatapp.engine.kv_placement import KVPlacer
from chatapp.engine.llama_native import DecodeAborted, NativeContext
from chatapp.engine.requests import GenerationRequest
from chatapp.engine.sequences import LiveSequence
from chatapp.engine.tasks import Task
from chatapp.engine.turns import TurnState
from chatapp.vocabulary import StopReason

log = logging.getLogger(__name__)


class Prefill:
    """Computes prompts into sequences of one context (see `run`)."""

    def __init__(
        self,
        context: NativeContext,
        cache: PrefixCache | None,
        placer: KVPlacer,
        *,
        min_rows: int,
        checkpoint_interval: int,
        gates: ArmedGates,
        grid: int = 0,
    ) -> None:
        self.context = context
        self.cache = cache
        self.placer = placer
        self.min_rows = min_rows
        self.grid = grid  # prompts in fixed batches of this many tokens (batching.py), 0: anywhere
        self._checkpoint_interval = checkpoint_interval
        self._gates = gates

    def run(
        self,
        task: Task,
        live: LiveSequence,
        prompt: list[int],
        *,
        need_logits: bool = True,
        checkpoints: frozenset[int] = frozenset(),
    ) -> Generator[None, None, StopReason | None]:
        """Evaluate the prompt tokens `live` does not hold yet, in batches; StopReason.CANCELLED if cancelled.

        The sequence's tokens grow by each batch once it is in the KV, so after a cancel they
        still list exactly what it holds and the next request reuses those batches. A batch
        also ends at each position in `checkpoints`, where the uncuttable state is kept.
        Other tasks take their steps between batches, not after the last: its logits are
        sampled before another sequence's decode replaces them. The recompute after an answer
        and a restore check (the engine's own work) neither count in the turn order nor pass a test gate.
        """
        job = task.current
        own_work = task.phase.answered  # an answer's recompute, a restore check
        batch = self.context.shape.n_batch
        rows = self.min_rows
        tokens = live.tokens
        start = len(tokens)
        while start < len(prompt):
            if job.cancel_event.is_set():
                return StopReason.CANCELLED
            end = batch_end(start, len(prompt), batch, checkpoints, rows, grid=self.grid)
            if end - start < rows and start > 0 and not self.grid:
                # A short rest after what was reused (a warm-up's last word, typed one at a
                # time): evaluate it again with the tokens before it, so that later requests
                # build on KV computed by the kernels a cold run uses.
                start = self.placer.cut(live.index, max(0, end - rows))
                continue
            chunk = prompt[start:end]
            is_last = start + len(chunk) == len(prompt)
            decoding = time.perf_counter()
            try:
                self.context.decode(
                    chunk, start_pos=start, sequence=live.index, logits_for_last=is_last and need_logits
                )
            except DecodeAborted:
                # llama.cpp may keep the micro-batches it finished: drop the whole batch (a recurrent
                # state updated in place by a stopped batch is rewound to a checkpoint).
                self.placer.recover(live.index, start)
                return StopReason.CANCELLED
            self.placer.costs.note_prefill(len(chunk), time.perf_counter() - decoding)
            if start == 0:  # a whole prompt shorter than a batch may be: see Runner.serve
                live.short_first_batch = len(chunk) < rows
            tokens.extend(chunk)
            live.computed(start, start + len(chunk))
            start += len(chunk)
            if not own_work:
                task.turn.prefill_left = len(prompt) - start
                self._store_if_awaited(task.turn, live, start, len(prompt))
            if start in checkpoints and not live.short_first_batch and start <= live.reusable:
                self._take_checkpoint(job.request, live)
            job.emit(PromptProgress(done=start, total=len(prompt)))
            if not own_work:
                self._gates.reach(Step.BATCH, job.request, job.cancel_event)
            if not is_last:
                yield
        return None

    def _store_if_awaited(self, turn: TurnState, live: LiveSequence, computed: int, length: int) -> None:
        """Store what is computed once a waiting request's shared tokens are (turns.py).

        A model whose state cannot be cut restores only at checkpoints: it stores at its prompt's end.
        """
        if not turn.store_at or live.short_first_batch:
            return
        if computed >= length or (computed >= turn.store_at and not self.placer.takes_checkpoints):
            self._store_for_waiting(live.index)
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

    def checkpoint_positions(self, request: GenerationRequest) -> frozenset[int]:
        """Where a prefill of `request` keeps the uncuttable state (empty for a plain KV cache).

        Each is kept for this session's rewinds, and stored in the cache unless the request
        says not to (a draft's warm-up, or one that bypasses the cache). A batch ends at each,
        with or without the cache: batches of other shapes round differently, and a prompt
        must be computed alike whether or not it was cached, so that an answer after a
        restore equals the answer of a run without the cache.
        """
        if not self.placer.takes_checkpoints:
            return frozenset()
        length = len(request.prompt_tokens)
        positions = stored_checkpoint_positions(
            length,
            request.checkpoints,
            self._checkpoint_interval,
            last=length if request.prefill_only else length - self.placer.fresh_tokens,
        )
        # On a grid only whole grid batches are reused: a checkpoint sits on the grid point before.
        return frozenset(on_grid(position, self.grid) for position in positions) - {0}

    def _take_checkpoint(self, request: GenerationRequest, live: LiveSequence) -> None:
        """Keep the uncuttable state at the sequence's end: for rewinds, and in the cache when allowed."""
        try:
            partial = read_sequence_state(self.context.pointer, live.index, partial=True)
        except StateFormatError as error:
            log.warning("cannot take a checkpoint: %s", error)
            return
        payload = self.placer.remember_checkpoint(live.index, len(live.tokens), partial)
        cache = self.cache if request.use_cache and request.store else None
        if cache is None or payload is None:
            return
        if not cache.has_checkpoint(live.tokens):
            cache.store_checkpoint(list(live.tokens), payload)
