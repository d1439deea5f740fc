"""Property test: random conversation trees replayed on a cached engine answer exactly as cold runs.

Each example is a small tree of conversations on the tiny random-weight llama (real
llama.cpp, real KV state, milliseconds per request): a few personas, questions drawn from a
small vocabulary so that prompts share prefixes, new conversations, follow-ups, branches from
earlier turns, regenerations, persona switches under the same history, requests that bypass
the cache or name their sequence, and restarts (a new engine on the same cache folder, so
blocks come back from disk). The cached engine has few sequences (so conversations are evicted
and restored from RAM) and small blocks (so cuts land inside blocks and restores assemble many
of them).

For every answer:
- the next token's logits after the prompt (the whole vector, bit for bit: their digests) and the
  greedy token ids equal those of a cold run of the same prompt on an engine without a cache
  (same model, per-sequence context, sequences and threads): a restore is exact;
- reused + computed == prompt tokens, and the tier is "none" exactly when nothing is reused;
- reuse is token-exact: never more than the longest prefix the prompt shares with what was
  stored before (anything more would be a wrong restore), and, once every earlier store has
  finished, at least that prefix less the engine's restore margin.

It runs on a tiny model of each memory kind: plain KV (llama), interleaved sliding window
(gemma3), hybrid attention and short convolutions (LFM2) and recurrent (Mamba), and on the
plain and sliding-window ones again with flash attention (every batch of 64 rows or more:
batching.py; there reuse is only checked from above, as prompts shorter than a batch are never
reused; on a device the hybrid one too), on the plain one with q8_0 KV cells (flash attention on;
cold runs of the same type), and on the CPU on the sliding-window one with the app's default
window cache (swa_full off: a ring of cells that long prompts wrap, so restores and cuts must leave
every cell where a cold run has it). Where the state cannot
be cut, reuse lands on checkpoints (the prompt's end less the tokens every answer evaluates
again, and each stored answer's end), and the lower bound is the deepest of those the prompt
shares.

Over the whole session the device, RAM and disk tiers must each have served some request
(checked by the last test of this module).

CHATAPP_PROPERTY_EXAMPLES sets the number of examples per kind (default 60).
CHATAPP_PROPERTY_SEED draws another set of examples (the default is the same set on every run), so
long runs can be split: runs with different seeds add up to more distinct examples.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from cache.keys import as_token_array
from cache.memory_kinds import MemoryKind
from chatapp.engine.batching import FLASH_ATTENTION_ROWS, on_grid
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.kv_placement import RESTORE_MARGIN_TOKENS
from chatapp.engine.kv_types import KvType
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.prompting.planner import PromptPlanner
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import Role, StopReason
from tests.cache_support import cached_engine
from tests.conftest import ON_DEVICE
from tests.model_factory import (
    TINY_MODEL_THREADS,
    write_tiny_gemma3,
    write_tiny_lfm2,
    write_tiny_llama,
    write_tiny_mamba,
)

# Random conversation trees on tiny models, 60 per memory kind in the suite (half a minute each on
# two cores; the notes' runs take thousands with CHATAPP_PROPERTY_EXAMPLES).
EXAMPLES = int(os.environ.get("CHATAPP_PROPERTY_EXAMPLES", "60"))
# The examples of a kind run in one test: its time limit grows with their number, so that a long run stops
# for a hang, not for its length. On a device (llvmpipe, the cores shared) an example of the sliding-window
# model took about 100 s; on the CPU a second or two.
SECONDS_PER_EXAMPLE = 150 if ON_DEVICE else 15
pytestmark = [pytest.mark.slow, pytest.mark.device, pytest.mark.timeout(max(900, SECONDS_PER_EXAMPLE * EXAMPLES))]

SEED = os.environ.get("CHATAPP_PROPERTY_SEED")
WRITERS: dict[MemoryKind, Callable[[Path], Path]] = {
    MemoryKind.PLAIN: write_tiny_llama,
    MemoryKind.ISWA: write_tiny_gemma3,
    MemoryKind.HYBRID: write_tiny_lfm2,
    MemoryKind.RECURRENT: write_tiny_mamba,
}
CONTEXT = 1024  # tokens per sequence; the longest example prompt stays well below it
# Batches of the ring variant: a window cache of 16 + 64 tokens padded to 256 cells, which long prompts wrap.
RING_BATCH = 64

PERSONAS = (
    "You are terse.",
    "You are a patient tutor. You explain one idea at a time, with a short example.",
    "You are a careful reviewer of essays. You point out unclear sentences and weak arguments, "
    "and you suggest one concrete improvement for each. " * 4,
    # Longer than the ring variant's window cache (256 cells): its conversations wrap the ring.
    "You are a librarian who knows every shelf of an old city library. " * 20,
)
WORDS = ("apple", "river", "stone", "blue", "seven", "why", "how", "the", "is", "a")

# Filled by the property test, checked by the last test of the module.
SESSION: Counter[str] = Counter()


@dataclass
class Node:
    """A conversation path that has been answered: its messages end with the assistant's answer."""

    messages: list[ChatMessage]
    max_tokens: int

    @property
    def turns(self) -> int:
        return (len(self.messages) - 1) // 2

    def up_to(self, turns: int) -> list[ChatMessage]:
        """The persona and the first `turns` complete turns."""
        return self.messages[: 1 + 2 * turns]


@dataclass(frozen=True)
class Step:
    kind: str  # new, continue, branch, repeat, repersona, restart
    node: int = 0  # which earlier node (modulo their number)
    turn: int = 0  # branch point (modulo the node's turns)
    persona: int = 0
    question: str = ""
    max_tokens: int = 8
    use_cache: bool = True
    sequence: int | None = None  # None: the engine chooses; else modulo the sequences
    flush: bool = True  # wait for the background store after this request


@dataclass(frozen=True)
class Plan:
    block_size: int
    sequences: int
    steps: tuple[Step, ...]


questions = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(lambda words: " ".join(words) + "?")

steps = st.builds(
    Step,
    kind=st.sampled_from(("new", "continue", "continue", "branch", "branch", "repeat", "repersona", "restart")),
    node=st.integers(0, 15),
    turn=st.integers(0, 15),
    persona=st.integers(0, len(PERSONAS) - 1),
    question=questions,
    max_tokens=st.integers(1, 10),
    use_cache=st.sampled_from((True, True, True, True, True, False)),
    sequence=st.one_of(st.none(), st.none(), st.none(), st.integers(0, 3)),
    flush=st.sampled_from((True, True, True, False)),
)

plans = st.builds(
    Plan,
    block_size=st.sampled_from((8, 7, 16)),
    sequences=st.sampled_from((2, 1, 3)),
    steps=st.lists(steps, min_size=3, max_size=9).map(tuple),
)


@dataclass(frozen=True)
class TinyModel:
    path: Path
    flash_attention: bool
    kv_type: KvType = KvType.F16
    # Off: a window cache of about one window and one batch per sequence (the app's default), here of
    # RING_BATCH batches, so that long prompts wrap its ring of cells.
    swa_full: bool = True

    @property
    def n_batch(self) -> int:
        return 512 if self.swa_full else RING_BATCH


@dataclass(frozen=True)
class Variant:
    kind: MemoryKind
    flash_attention: bool = False
    kv_type: KvType = KvType.F16  # a quantized type brings flash attention
    swa_full: bool = True

    def __str__(self) -> str:
        flash = "+flash" if self.flash_attention else ""
        ring = "" if self.swa_full else "+ring"
        return f"{self.kind}{flash}{'+' + self.kv_type if self.kv_type.quantized else ''}{ring}"


VARIANTS = [
    *(Variant(kind) for kind in WRITERS),
    Variant(MemoryKind.PLAIN, flash_attention=True),
    Variant(MemoryKind.ISWA, flash_attention=True),
    Variant(MemoryKind.PLAIN, flash_attention=True, kv_type=KvType.Q8_0),
    # A device's flash attention reads every cell of the cache: the hybrid model's attention layers too.
    *([Variant(MemoryKind.HYBRID, flash_attention=True)] if ON_DEVICE else []),
    # The app's default window cache (swa_full off): a ring of cells that long prompts wrap, restored cell for
    # cell where a cold run has them (assemble_state). A device always has the full-size one (loading.py).
    *([] if ON_DEVICE else [Variant(MemoryKind.ISWA, swa_full=False)]),
]


@pytest.fixture(scope="module", params=VARIANTS, ids=str)
def tiny_model(request: pytest.FixtureRequest) -> Iterator[TinyModel]:
    variant: Variant = request.param
    folder = Path(tempfile.mkdtemp(prefix="chatapp-prop-model-"))
    try:
        if variant.kv_type.quantized:  # heads of 32 values: a multiple of a quantized block
            path = write_tiny_llama(folder / "tiny.gguf", n_embd=128)
        else:
            path = WRITERS[variant.kind](folder / "tiny.gguf")
        yield TinyModel(path, variant.flash_attention, variant.kv_type, variant.swa_full)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def cold_engines(tiny_model: TinyModel) -> Iterator[dict[int, Engine]]:
    """Engines without a cache, one per sequence count, opened when first needed."""
    engines: dict[int, Engine] = {}
    yield engines
    for engine in engines.values():
        engine.close()


def cold_engine(engines: dict[int, Engine], model: TinyModel, sequences: int) -> Engine:
    if sequences not in engines:
        engines[sequences] = Engine(
            EngineConfig(
                model_path=model.path,
                context_cap=CONTEXT,
                sequences=sequences,
                threads=TINY_MODEL_THREADS,
                flash_attention=model.flash_attention,
                kv_type=model.kv_type,
                swa_full=model.swa_full,
                n_batch=model.n_batch,
            )
        )
    return engines[sequences]


def common_prefix(left: tuple[int, ...], right: tuple[int, ...]) -> int:
    length = 0
    for a, b in zip(left, right, strict=False):
        if a != b:
            break
        length += 1
    return length


def evaluated_tokens(prompt: tuple[int, ...], answer: tuple[int, ...], stop_reason: str) -> tuple[int, ...]:
    """What the sequence holds after an answer: the last sampled token is only decoded if another follows."""
    if stop_reason == StopReason.END:
        return prompt + answer
    assert stop_reason == StopReason.LENGTH, stop_reason
    return prompt + answer[:-1]


@dataclass
class Replay:
    """One example's run: the cached engine, the tree so far, and what the cache has been given."""

    plan: Plan
    folder: Path
    model: TinyModel
    cold: Engine
    engine: Engine | None = None
    nodes: list[Node] = field(default_factory=list)
    stored: list[tuple[int, ...]] = field(default_factory=list)  # handed to the cache (maybe in part)
    # Known to be stored whole: an answer whose store was waited for before the next request
    # (a request that comes first stops the answer's recompute, and less of it is stored).
    confirmed: list[tuple[int, ...]] = field(default_factory=list)
    # Where the engine kept checkpoints (models whose state cannot be cut): known to be written,
    # and taken during prefills since the last wait for the cache.
    checkpoints: list[tuple[int, ...]] = field(default_factory=list)
    pending_checkpoints: list[tuple[int, ...]] = field(default_factory=list)
    # What this engine computed without the cache: still resident, so reusable in place.
    uncached: list[tuple[int, ...]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    def open(self) -> None:
        self.engine = cached_engine(
            self.folder,
            self.model.path,
            block_size=self.plan.block_size,
            context=CONTEXT,
            sequences=self.plan.sequences,
            threads=TINY_MODEL_THREADS,
            flash_attention=self.model.flash_attention,
            kv_type=self.model.kv_type,
            swa_full=self.model.swa_full,
            n_batch=self.model.n_batch,
        )
        assert self.engine.info.flash_attention == self.model.flash_attention
        assert self.engine.cache is not None, self.engine.cache_problem
        self.uncached = []

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()  # flushes the background stores
            self.engine = None
            self.checkpoints += self.pending_checkpoints
            self.pending_checkpoints = []

    def wait_until_stored(self, held: tuple[int, ...]) -> None:
        """Wait until the blocks of the answer just given, and every earlier one, are stored."""
        assert self.engine is not None
        assert self.engine.cache is not None
        self.engine.flush_cache()
        if self.model.flash_attention and len(held) < FLASH_ATTENTION_ROWS:
            return  # too short for a batch of flash attention's tiled kernel: never kept
        if self.engine.info.prompt_grid:
            return  # on a grid (a device) only whole batches are kept: the lower bound on reuse shows they were
        stored = self.engine.cache.lookup(as_token_array(held)).tokens
        # A checkpoint fewer than checkpoint_min_gap tokens after a stored one is not stored.
        gap = self.engine.cache.config.checkpoint_min_gap if self.engine.takes_checkpoints else 1
        assert len(held) - stored < max(gap, 1), (
            f"only {stored} of the answer's {len(held)} tokens were stored\n" + "\n".join(self.log)
        )

    def ask(self, messages: list[ChatMessage], step: Step) -> Node:
        assert self.engine is not None
        prompt = tuple(self.engine.prompt_builder.build(messages))
        sampling = SamplingParams(temperature=0.0, max_tokens=step.max_tokens)
        sequence = None if step.sequence is None else step.sequence % self.plan.sequences
        cold = self.cold.generate(GenerationRequest(prompt, sampling, use_cache=False)).wait()
        boundaries = (
            PromptPlanner(self.engine.prompt_builder).boundaries(messages) if self.engine.takes_checkpoints else ()
        )
        warm = self.engine.generate(
            GenerationRequest(prompt, sampling, sequence=sequence, use_cache=step.use_cache, checkpoints=boundaries)
        ).wait()
        stats = warm.stats
        self.log.append(
            f"{step.kind}: {len(prompt)} prompt tokens, reused {stats.reused_tokens} ({stats.reuse_tier}), "
            f"use_cache={step.use_cache} sequence={sequence}"
        )
        SESSION["requests"] += 1
        SESSION[f"tier_{stats.reuse_tier}"] += 1
        SESSION["prompt_tokens"] += stats.prompt_tokens
        SESSION["reused_tokens"] += stats.reused_tokens
        if not self.model.swa_full:
            SESSION["ring_requests"] += 1
            # Restored past the ring's end: the window's cells wrapped around it, a placeholder where the next goes.
            ring = self.engine.placer.window_ring
            SESSION["wrapped_ring_restores"] += stats.reuse_tier in ("ram", "disk") and stats.reused_tokens > ring
        SESSION["logits_compared"] += 1

        history = "\n".join(self.log)
        # Bit for bit: the next token's whole logit vector after the prompt, then every greedy token.
        assert warm.stats.logits_digest == cold.stats.logits_digest, f"logits differ from a cold run\n{history}"
        assert warm.token_ids == cold.token_ids, f"answer differs from a cold run\n{history}"
        assert warm.stop_reason == cold.stop_reason, history
        assert stats.prompt_tokens == len(prompt), history
        assert stats.reused_tokens + stats.computed_tokens == stats.prompt_tokens, history
        assert stats.reuse_tier in ("none", "device", "ram", "disk"), history
        assert (stats.reuse_tier == "none") == (stats.reused_tokens == 0), history
        held = evaluated_tokens(prompt, warm.token_ids, warm.stop_reason)
        if not step.use_cache:
            assert stats.reused_tokens == 0, history
            assert stats.reuse_tier == "none", history
            self.uncached.append(held)
        else:
            limit = max(0, len(prompt) - self.engine.placer.fresh_tokens)
            known = max((common_prefix(prompt, tokens) for tokens in [*self.stored, *self.uncached]), default=0)
            assert stats.reused_tokens <= min(known, limit), (
                f"reused more than any computed prefix shares ({known})\n{history}"
            )
            shared = min(max((common_prefix(prompt, tokens) for tokens in self.confirmed), default=0), limit)
            if self.engine.takes_checkpoints:
                # Each checkpoint, or one stored fewer than checkpoint_min_gap tokens before it. On a grid
                # only those at grid points: a state cannot be cut back to one, and a prefill from
                # anywhere else would end a batch off the grid.
                assert self.engine.cache is not None
                skipped = self.engine.cache.config.checkpoint_min_gap - 1
                grid = self.engine.info.prompt_grid
                shared = max(
                    (
                        len(point)
                        for point in self.checkpoints
                        if len(point) <= limit
                        and prompt[: len(point)] == point
                        and on_grid(len(point), grid) == len(point)
                    ),
                    default=0,
                )
                shared -= min(shared, skipped)
            if not self.model.flash_attention:
                shared = on_grid(shared, self.engine.info.prompt_grid)  # a device reuses whole grid batches
                assert stats.reused_tokens >= shared - RESTORE_MARGIN_TOKENS, (
                    f"reused {stats.reused_tokens} of {shared} shared tokens\n{history}"
                )
            self.stored.append(held)
            # The boundaries this prefill passed were checkpointed (those before its start were reused).
            self.pending_checkpoints += [prompt[:boundary] for boundary in boundaries if boundary > stats.reused_tokens]
            if step.flush:
                self.wait_until_stored(held)
                self.confirmed.append(held)
                self.checkpoints += [held, *self.pending_checkpoints]
                self.pending_checkpoints = []
        node = Node([*messages, ChatMessage(Role.ASSISTANT, (warm.text,), warm.token_ids)], step.max_tokens)
        self.nodes.append(node)
        return node


def run_plan(plan: Plan, model: TinyModel, cold: Engine) -> None:
    folder = Path(tempfile.mkdtemp(prefix="chatapp-prop-kv-"))
    replay = Replay(plan, folder / "kv", model, cold)
    started = time.perf_counter()
    try:
        replay.open()
        for step in plan.steps:
            if step.kind == "restart":
                replay.close()
                replay.log.append("restart")
                SESSION["restarts"] += 1
                replay.open()
                continue
            if not replay.nodes or step.kind == "new":
                messages = [
                    ChatMessage.of(Role.SYSTEM, PERSONAS[step.persona]),
                    ChatMessage.of(Role.USER, step.question),
                ]
                replay.ask(messages, step)
                continue
            node = replay.nodes[step.node % len(replay.nodes)]
            if step.kind == "continue":
                replay.ask([*node.messages, ChatMessage.of(Role.USER, step.question)], step)
            elif step.kind == "branch":  # another question after one of the node's earlier turns
                turns = step.turn % node.turns
                replay.ask([*node.up_to(turns), ChatMessage.of(Role.USER, step.question)], step)
            elif step.kind == "repeat":  # regenerate the node's last answer
                again = replay.ask(node.messages[:-1], step)
                if step.max_tokens == node.max_tokens:
                    assert again.messages[-1].generated_ids == node.messages[-1].generated_ids
            elif step.kind == "repersona":  # the same history and question under another persona
                persona = PERSONAS[step.persona]
                if persona == node.messages[0].content:
                    persona = PERSONAS[(step.persona + 1) % len(PERSONAS)]
                replay.ask([ChatMessage.of(Role.SYSTEM, persona), *node.messages[1:-1]], step)
            else:
                raise AssertionError(step.kind)
    finally:
        replay.close()
        shutil.rmtree(folder, ignore_errors=True)
        SESSION["examples"] += 1
        SESSION["seconds_x1000"] += int((time.perf_counter() - started) * 1000)


def seeded(test: Callable[..., None]) -> Callable[..., None]:
    """Another set of examples when CHATAPP_PROPERTY_SEED is set (in Hypothesis a seed outranks derandomize)."""
    return seed(int(SEED))(test) if SEED else test


@seeded
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(plan=plans)
def test_cached_answers_equal_cold_answers(plan: Plan, tiny_model: TinyModel, cold_engines: dict[int, Engine]) -> None:
    run_plan(plan, tiny_model, cold_engine(cold_engines, tiny_model, plan.sequences))


def test_every_tier_served_requests_over_the_session() -> None:
    """Runs after the property test (file order): reuse happened, from the device, RAM and disk."""
    if not SESSION["examples"]:
        pytest.skip("the property test did not run")
    summary = ", ".join(f"{key}={value}" for key, value in sorted(SESSION.items()))
    print(f"\ncache property session: {summary}")
    assert SESSION["reused_tokens"] > 0, summary
    for tier in ("device", "ram", "disk"):
        assert SESSION[f"tier_{tier}"] > 0, f"no request was served from the {tier} tier: {summary}"
    if SESSION["ring_requests"]:
        assert SESSION["wrapped_ring_restores"] > 0, f"no restore wrapped a window ring: {summary}"
