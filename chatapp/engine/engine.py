"""The engine: one llama.cpp context, owned by one thread, serving generation requests.

The UI and the CLI never touch llama.cpp. They submit a `GenerationRequest` and read
events from its `GenerationHandle` (prefill progress, token text), which they may cancel
at any time; the engine thread does all model work, so a long prefill never blocks them.

This class is the facade the rest of the app sees (contract.py's LocalEngine). Its parts:
config.py (how it is set up), loading.py (the model, its context, the state-format
self-test), scheduler.py (the engine thread: which request starts and steps when),
runner.py (one request, from placement to storing), kv_placement.py (where a prompt goes
and what of it is reused) and sequences.py (what each sequence holds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from cache.keys import as_token_array
from cache.prefix_cache import PrefixCache
from cache.state_format import MemoryLayout
from chatapp.engine.config import CacheFactory, EngineConfig, default_thread_count
from chatapp.engine.gate import ArmedGates, Step, StepGate
from chatapp.engine.handle import GenerationHandle
from chatapp.engine.kv_placement import KVPlacer
from chatapp.engine.llama_native import NativeContext, NativeModel
from chatapp.engine.loading import LoadedModel, load_model
from chatapp.engine.model_card import LOCAL_CAPABILITIES, Capabilities, ModelInfo
from chatapp.engine.requests import GenerationRequest
from chatapp.engine.restore_costs import RestoreCosts
from chatapp.engine.runner import Runner
from chatapp.engine.scheduler import Scheduler
from chatapp.engine.sequences import Sequences
from chatapp.errors import ContextOverflowError
from chatapp.prompting.prompt import PromptBuilder

# EngineConfig and the rest stay importable from here (tests and older callers use this path).
__all__ = ["CacheFactory", "Engine", "EngineConfig", "default_thread_count"]


class Engine:
    """Loads a model, owns its context on a private thread, and runs requests in order."""

    def __init__(self, config: EngineConfig, cache_factory: CacheFactory | None = None) -> None:
        self.config = config
        self._cache_factory = cache_factory
        self._gates = ArmedGates()
        self._loaded: LoadedModel  # set on the engine thread, before start() returns
        self._runner: Runner
        self._scheduler = Scheduler(self._open)
        if (error := self._scheduler.start()) is not None:
            raise error

    def _open(self, should_abort: Callable[[], bool]) -> Runner:
        """Engine thread: load the model, then the placement and the runner that serve requests."""
        loaded = load_model(self.config, self._cache_factory, should_abort)
        cache = loaded.cache
        try:
            placer = KVPlacer(
                loaded.context,
                cache,
                loaded.model.memory,
                loaded.layout,
                # Whole states are a RAM restore too: never more than the RAM tier may hold.
                ready_state_bytes=min(self.config.ready_state_bytes, cache.config.ram_budget_bytes) if cache else 0,
                min_rows=loaded.min_rows,
                grid=loaded.grid,
                window_ring=loaded.info.window_cells,
            )
        except BaseException:
            loaded.close()
            raise
        if cache is not None:
            cache.pace.others_computing = self._scheduler.computing
        self._loaded = loaded
        self._runner = Runner(loaded, placer, self.config.checkpoint_interval, self._gates, self._scheduler)
        return self._runner

    # Public API, safe from any thread.
    def generate(self, request: GenerationRequest) -> GenerationHandle:
        """Queue a request; its prompt must fit in one sequence's context (else ContextOverflowError) and
        llama.cpp must take its grammar (else GrammarError)."""
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
        if request.sampling.grammar is not None:
            self._loaded.model.check_grammar(request.sampling.grammar)  # GrammarError before any prompt is computed
        handle = GenerationHandle(request)
        self._scheduler.submit(handle)
        return handle

    def flush_cache(self, *, checks: bool = False) -> None:
        """Wait until every answer so far has been handed to the cache and stored.

        Answers are stored after their caller is told they are done, so that storing never
        delays a reply; this waits for the engine thread to get there, then for the writer.
        A restore check in idle time is given up (its prompt stays sampled) unless `checks`.
        """
        if self._scheduler.flush(checks=checks) and self.cache is not None:
            self.cache.flush()

    def holding(
        self, step: Step, after: int, where: Callable[[GenerationRequest], bool] | None = None
    ) -> AbstractContextManager[StepGate]:
        """For tests: hold the engine thread right after the `after`-th step of that kind (see gate.py),
        counting only the requests `where` accepts.

        Inside the block the gate holds once, until released or the held request is cancelled;
        leaving the block releases it and disarms it. Several gates may be armed at once. In a build
        with a device the held engine keeps the device's turn (device_turns.py): other engines wait for it,
        and one constructed inside the block does not load until the gate lets go.
        """
        return self._gates.holding(step, after, where)

    @property
    def info(self) -> ModelInfo:
        return self._loaded.info

    @property
    def prompt_builder(self) -> PromptBuilder:
        return self._loaded.prompt_builder

    @property
    def cache(self) -> PrefixCache | None:
        return self._loaded.cache

    @property
    def cache_problem(self) -> str | None:
        return self._loaded.cache_problem

    @property
    def batching(self) -> tuple[bool, str | None]:
        """Whether several answers' tokens share one decode here, and why not (batch_rule.py)."""
        return self._loaded.batch_answers, self._loaded.batch_problem

    @property
    def batched_decodes(self) -> int:
        """Decodes so far that evaluated several answers' tokens at once."""
        return self._runner.batched_decodes

    @property
    def layout(self) -> MemoryLayout | None:
        """The verified state format (None when the self-test failed)."""
        return self._loaded.layout

    @property
    def model(self) -> NativeModel:
        return self._loaded.model

    @property
    def context(self) -> NativeContext:
        return self._loaded.context

    @property
    def placer(self) -> KVPlacer:
        return self._runner.placer

    @property
    def sequences(self) -> Sequences:
        """What each sequence holds (for tests: read only, and only while the engine is idle)."""
        return self._runner.sequences

    @property
    def min_rows(self) -> int:
        """The fewest tokens in a prompt batch (see batching.py): more with flash attention (if it attends)."""
        return self._loaded.min_rows

    @property
    def restore_costs(self) -> RestoreCosts:
        """The measured speeds behind each choice between restoring a hit and computing it."""
        return self.placer.costs

    @property
    def capabilities(self) -> Capabilities:
        return LOCAL_CAPABILITIES

    def forget_cached(self, prompts: Sequence[Sequence[int]], keep: Sequence[Sequence[int]] = ()) -> int:
        """The cache's entries (RAM and disk) and the whole states kept ready that hold what only `prompts`
        used (see PrefixCache.forget); thread-safe. Sequences resident in the context are overwritten by
        the next answers that need their slots."""
        cache = self.cache
        if cache is None:
            return 0
        removed = cache.forget(prompts, keep)
        return removed + self.placer.ready.forget(
            [as_token_array(prompt) for prompt in prompts], [as_token_array(prompt) for prompt in keep]
        )

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
        self._scheduler.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
