"""Answers batched in one decode are the answers computed alone, bit for bit (issue 22, part 3).

Several requests stream at once on one engine: where the model is batch-invariant (batch_rule.py:
Q4_0, Q4_1, Q5_0 and Q8_0 weights, flash attention off, confirmed by the start-up probe: plain,
sliding-window and hybrid models alike), their
answer tokens share one llama_decode per step; elsewhere (F16, K-quants) each is decoded alone,
as before. Random sets of 1..4 concurrent requests (prompt lengths that leave one token over a
batch, a short beside a long, staggered arrivals, cold runs and cache hits) must give every
request the greedy token ids of the same request computed alone on a cold engine. Random
weights keep the logits close together, so a rounding difference flips a token soon.

CHATAPP_BATCH_EXAMPLES sets the examples per model (default 12; the issue's 1,000 in the note).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatapp.engine.batch_rule import probe_problem
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.events import AnswerText
from chatapp.engine.handle import GenerationHandle
from chatapp.engine.llama_native import NativeContext, NativeModel
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.engine.sampling import NativeSampler
from tests.cache_support import cached_engine
from tests.model_factory import quantize_model, write_tiny_gemma3, write_tiny_lfm2, write_tiny_llama

pytestmark = [pytest.mark.slow, pytest.mark.device]
EXAMPLES = int(os.environ.get("CHATAPP_BATCH_EXAMPLES", "12"))
BATCH = 16  # tokens per prompt batch: prompts of 16k + 1 tokens leave one over
CONTEXT = 256
# Must batch: gemma3 has sliding-window attention, lfm2 short convolutions beside attention (hybrid).
BATCHING = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "gemma3-Q4_0", "lfm2-Q4_0")
PLAIN_KINDS = BATCHING[:4]
ALONE = ("F16",)  # must not: the rule refuses its weights' type
PROBED = ("Q4_K_M", "Q6_K")  # the probe decides: unrepacked K-quants batch, repacked ones may not
# K-quant prompts split differently (a cache hit computes the rest in a smaller batch) round
# differently: their cache hits part from cold runs whether or not answers batch (README,
# Exactness), so they run cold here; the others' prompt chunks are invariant too.
NO_CACHE_HITS = PROBED


@dataclass(frozen=True)
class Ask:
    prompt: tuple[int, ...]
    max_tokens: int
    after: int  # answer tokens of the request before it to wait for before it is sent
    use_cache: bool


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("batched")
    f16 = write_tiny_llama(folder / "tiny-F16.gguf", n_embd=256, n_ff=512)
    kinds = {kind: quantize_model(f16, folder / f"tiny-{kind}.gguf", kind) for kind in (*PLAIN_KINDS, *PROBED)}
    gemma3 = write_tiny_gemma3(folder / "tiny-gemma3-F16.gguf", n_embd=256, n_ff=512)
    lfm2 = write_tiny_lfm2(folder / "tiny-lfm2-F16.gguf", n_embd=256, n_ff=512)
    return {
        "F16": f16,
        **kinds,
        # A window of 16 positions: most prompts and answers here reach past it.
        "gemma3-Q4_0": quantize_model(gemma3, folder / "tiny-gemma3-Q4_0.gguf", "Q4_0"),
        "lfm2-Q4_0": quantize_model(lfm2, folder / "tiny-lfm2-Q4_0.gguf", "Q4_0"),
    }


Answer = tuple[tuple[int, ...], tuple[str, ...]]  # token ids, and a digest of the logits each was sampled from


class LogitsLog:
    """The logits every sample read, by request (its SamplingParams object): a test-only wrap of the
    real sampler, which reads the row the engine points it at."""

    def __init__(self) -> None:
        self.digests: dict[int, list[str]] = {}

    def install(self, patch: pytest.MonkeyPatch) -> None:
        real_init, real_sample = NativeSampler.__init__, NativeSampler.sample
        log = self

        def init(sampler: NativeSampler, params: SamplingParams, model: NativeModel) -> None:
            real_init(sampler, params, model)
            sampler.logged_as = id(params)  # type: ignore[attr-defined]
            log.digests[id(params)] = []  # one sampler per request; an id may be a freed object's

        def sample(sampler: NativeSampler, context: NativeContext, row: int = -1) -> int:
            logits = context.logits(row)
            log.digests.setdefault(sampler.logged_as, []).append(xxhash.xxh3_64_hexdigest(logits.tobytes()))  # type: ignore[attr-defined]
            return real_sample(sampler, context, row)

        patch.setattr(NativeSampler, "__init__", init)
        patch.setattr(NativeSampler, "sample", sample)

    def answer(self, params: SamplingParams, token_ids: tuple[int, ...]) -> Answer:
        return token_ids, tuple(self.digests.pop(id(params), []))


@pytest.fixture(scope="module")
def logits_log() -> Iterator[LogitsLog]:
    log = LogitsLog()
    with pytest.MonkeyPatch.context() as patch:
        log.install(patch)
        yield log


class Reference:
    """Each prompt's answer computed alone on a cold engine without a cache, remembered."""

    def __init__(self, model: Path, log: LogitsLog) -> None:
        self.engine = Engine(EngineConfig(model, context_cap=CONTEXT, sequences=1, threads=1, n_batch=BATCH))
        self.log = log
        self.answers: dict[tuple[tuple[int, ...], int], Answer] = {}

    def answer(self, ask: Ask) -> Answer:
        key = (ask.prompt, ask.max_tokens)
        if key not in self.answers:
            request = GenerationRequest(ask.prompt, greedy(ask.max_tokens), use_cache=False)
            self.answers[key] = self.log.answer(request.sampling, self.engine.generate(request).wait().token_ids)
        return self.answers[key]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


@pytest.fixture(scope="module", params=[*BATCHING, *ALONE, *PROBED])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def engines(
    kind: str, models: dict[str, Path], logits_log: LogitsLog, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Engine, Reference]]:
    folder = tmp_path_factory.mktemp(f"cache-{kind}")
    engine = cached_engine(folder, models[kind], context=CONTEXT, sequences=4, threads=1, n_batch=BATCH)
    reference = Reference(models[kind], logits_log)
    yield engine, reference
    engine.close()
    reference.engine.close()


def asks() -> st.SearchStrategy[list[Ask]]:
    lengths = st.one_of(st.sampled_from([1, 2, BATCH - 1, BATCH, BATCH + 1, 2 * BATCH + 1]), st.integers(1, 60))
    prompts = lengths.flatmap(lambda length: st.lists(st.integers(2, 60), min_size=length, max_size=length))
    one = st.builds(Ask, prompts.map(tuple), st.integers(1, 10), st.integers(0, 4), st.booleans())
    return st.lists(one, min_size=1, max_size=4)


def run_together(engine: Engine, batch: list[Ask], log: LogitsLog, *, hits: bool = True) -> list[Answer]:
    """Send the requests, each after the one before has streamed `after` tokens; their answers.

    Without `hits` every request runs cold (its prompt neither restored nor stored)."""
    handles: list[GenerationHandle] = []
    for ask in batch:
        if handles and ask.after:
            seen = 0
            for event in handles[-1].events():
                seen += isinstance(event, AnswerText)
                if seen >= ask.after:
                    break
        request = GenerationRequest(ask.prompt, greedy(ask.max_tokens), use_cache=ask.use_cache and hits)
        handles.append(engine.generate(request))
    results = [handle.wait().token_ids for handle in handles]
    return [log.answer(handle.request.sampling, ids) for handle, ids in zip(handles, results, strict=True)]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(batch=asks())
def test_every_answer_is_the_one_computed_alone(
    engines: tuple[Engine, Reference], logits_log: LogitsLog, kind: str, batch: list[Ask]
) -> None:
    """Token ids and the logits each was sampled from, bit for bit."""
    engine, reference = engines
    answers = run_together(engine, batch, logits_log, hits=kind not in NO_CACHE_HITS)
    assert answers == [reference.answer(ask) for ask in batch]
    batches, problem = engine.batching
    if engine.info.gpu_layers > 0:  # on a device the probe decides for every kind (batch_rule.py)
        assert batches or (problem is not None and "together differ" in problem), problem
    elif kind in BATCHING:
        assert batches, problem
    elif kind in ALONE:
        assert problem is not None
        assert "kernels depend on the batch's size" in problem
    elif kind in PROBED and not batches:
        assert problem is not None
        assert "together differ" in problem, "the rule lets K-quants through to the probe"
    if not batches:
        assert engine.batched_decodes == 0


def test_answers_shared_decodes_where_the_model_batches(
    engines: tuple[Engine, Reference], logits_log: LogitsLog, kind: str
) -> None:
    """Three long answers at once: their tokens went through shared decodes (and came out right)."""
    engine, reference = engines
    before = engine.batched_decodes
    batch = [Ask(tuple(range(3 + index, 20 + index)), 10, 0, False) for index in range(3)]
    assert run_together(engine, batch, logits_log) == [reference.answer(ask) for ask in batch]
    assert (engine.batched_decodes > before) == engine.batching[0]


def test_the_probe_refuses_f16_weights_the_rule_would_not_have_seen(models: dict[str, Path]) -> None:
    """The rule refuses F16 by its type; the probe alone must refuse it too (one row's kernels differ)."""
    model = NativeModel(models["F16"])
    context = NativeContext(model, n_sequences=3, n_ctx_per_sequence=CONTEXT, n_threads=1, n_batch=BATCH)
    try:
        problem = probe_problem(model, context)
        assert problem is not None
        assert "together differ" in problem
        assert probe_problem(model, context) == problem, "the probe leaves the context as it found it"
    finally:
        context.close()
        model.close()
