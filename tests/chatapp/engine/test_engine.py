"""The engine on the real bundled model: generation, reuse, cancellation, determinism, errors."""

from __future__ import annotations

import pytest

from chatapp.engine.batching import on_grid
from chatapp.engine.engine import Engine
from chatapp.engine.events import AnswerText, GenerationResult, PromptProgress, PromptReuse
from chatapp.engine.gate import Step
from chatapp.engine.llama_native import DecodeAborted, NativeContext, NativeModel
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.errors import ContextOverflowError
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import ReuseTier, Role, StopReason

# ignore_eos: every answer runs to max_tokens, whatever the model would write on this CPU.
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def first_batch(engine: Engine) -> int:
    """How many tokens a prompt's first batch holds: n_batch, or a grid batch where the model is on one."""
    return engine.info.prompt_grid or engine.context.shape.n_batch


def prompt_for(engine: Engine, question: str, persona: str | None = None) -> tuple[int, ...]:
    messages = ([ChatMessage.of(Role.SYSTEM, persona)] if persona else []) + [ChatMessage.of(Role.USER, question)]
    return tuple(engine.prompt_builder.build(messages))


def run(
    engine: Engine,
    prompt: tuple[int, ...],
    sampling: SamplingParams = GREEDY,
    *,
    sequence: int | None = None,
    use_cache: bool = True,
) -> GenerationResult:
    request = GenerationRequest(prompt_tokens=prompt, sampling=sampling, sequence=sequence, use_cache=use_cache)
    return engine.generate(request).wait()


def test_answer_streams_token_by_token(engine: Engine) -> None:
    handle = engine.generate(GenerationRequest(prompt_for(engine, "Name three colours."), GREEDY, use_cache=False))
    events = list(handle.events())
    texts = [event for event in events if isinstance(event, AnswerText)]
    result = handle.wait()
    assert len(texts) == result.stats.generated_tokens > 1
    assert "".join(event.text for event in texts) == result.text
    assert [event.token_id for event in texts] == list(result.token_ids)
    # First where the prompt was placed (nothing reused without the cache), then its progress.
    assert events[0] == PromptReuse(0, result.stats.prompt_tokens, ReuseTier.NONE)
    assert isinstance(events[1], PromptProgress)
    assert events[1].done == events[1].total == result.stats.prompt_tokens


def test_greedy_is_reproducible_and_reports_consistent_stats(engine: Engine) -> None:
    prompt = prompt_for(engine, "What is the capital of France?")
    first = run(engine, prompt, use_cache=False)
    second = run(engine, prompt, use_cache=False)
    assert first.token_ids == second.token_ids
    assert first.text == second.text
    stats = first.stats
    assert stats.prompt_tokens == len(prompt)
    assert stats.reused_tokens + stats.computed_tokens == stats.prompt_tokens
    assert stats.reused_tokens == 0
    assert stats.reuse_tier == "none"
    assert 0 < stats.ttft_ms <= stats.total_ms
    assert first.stop_reason == StopReason.LENGTH
    assert stats.generated_tokens == GREEDY.max_tokens


def test_reusing_the_live_prefix_gives_the_same_answer(engine: Engine) -> None:
    persona = "You are a careful assistant who answers in one sentence. " * 6  # past a grid batch (a GPU's)
    cold = run(engine, prompt_for(engine, "Why is the sky blue?", persona), use_cache=False)
    run(engine, prompt_for(engine, "Why is grass green?", persona), use_cache=False)
    warm = run(engine, prompt_for(engine, "Why is the sky blue?", persona))
    assert warm.stats.reused_tokens > 10
    assert warm.stats.reuse_tier == "device"
    assert warm.stats.computed_tokens == warm.stats.prompt_tokens - warm.stats.reused_tokens
    assert warm.token_ids == cold.token_ids


def test_seeded_sampling_is_reproducible(engine: Engine) -> None:
    prompt = prompt_for(engine, "Tell me a word.")
    sampling = SamplingParams(temperature=1.2, top_p=0.95, seed=1234, max_tokens=16)
    first = run(engine, prompt, sampling, use_cache=False)
    second = run(engine, prompt, sampling, use_cache=False)
    other_seed = run(
        engine, prompt, SamplingParams(temperature=1.2, top_p=0.95, seed=99, max_tokens=16), use_cache=False
    )
    assert first.token_ids == second.token_ids
    assert other_seed.token_ids != first.token_ids


def test_sequences_do_not_disturb_each_other(engine: Engine) -> None:
    a, b = prompt_for(engine, "Count to five."), prompt_for(engine, "List two fruits.")
    alone = run(engine, a, sequence=0, use_cache=False)
    run(engine, b, sequence=1, use_cache=False)
    again = run(engine, a, sequence=0, use_cache=False)
    assert again.token_ids == alone.token_ids


def test_cancel_during_answer_keeps_what_was_generated(engine: Engine) -> None:
    with engine.holding(Step.TOKEN, after=3) as gate:  # the answer cannot end before the cancel
        handle = engine.generate(
            GenerationRequest(
                prompt_for(engine, "Write a long story."),
                SamplingParams(temperature=0, max_tokens=500, ignore_eos=True),
            )
        )
        assert gate.wait_until_holding()
        handle.cancel()
        result = handle.wait()
    assert result.stop_reason == StopReason.CANCELLED
    assert result.stats.generated_tokens == 3


def test_cancel_during_prefill_then_the_sequence_is_still_exact(engine: Engine) -> None:
    long_question = "Summarise this: " + "the quick brown fox jumps over the lazy dog. " * 80
    prompt = prompt_for(engine, long_question)
    assert len(prompt) > engine.context.shape.n_batch  # more than one batch
    reference = run(engine, prompt, use_cache=False, sequence=1)
    with engine.holding(Step.BATCH, after=1) as gate:  # held after the first batch
        handle = engine.generate(GenerationRequest(prompt, GREEDY, use_cache=False, sequence=0))
        assert gate.wait_until_holding()
        handle.cancel()
        cancelled = handle.wait()
    assert cancelled.stop_reason == StopReason.CANCELLED
    assert cancelled.stats.generated_tokens == 0
    assert engine.sequences[0].tokens == list(prompt[: first_batch(engine)])  # a partial prefill stays
    after = run(engine, prompt, sequence=0)  # continues from the partial prefill
    assert 0 < after.stats.reused_tokens < len(prompt) - 2
    assert after.token_ids == reference.token_ids


def test_cancel_between_prefill_batches(engine: Engine) -> None:
    prompt = prompt_for(engine, "Repeat: " + "lorem ipsum dolor sit amet " * 90)
    assert len(prompt) > engine.context.shape.n_batch
    progress = []
    with engine.holding(Step.BATCH, after=1):
        handle = engine.generate(GenerationRequest(prompt, GREEDY, use_cache=False))
        for event in handle.events():
            if isinstance(event, PromptProgress):
                progress.append(event.done)
                handle.cancel()  # from the caller's thread, while the engine is held after the batch
        result = handle.wait()
    assert result.stop_reason == StopReason.CANCELLED
    assert result.stats.generated_tokens == 0
    assert progress == [first_batch(engine)]  # no batch ran after the cancel


def test_abort_flag_interrupts_a_decode_in_flight(model_path) -> None:
    """llama.cpp polls the flag inside llama_decode: a long batch stops without finishing."""
    model = NativeModel(model_path)
    context = NativeContext(model, n_sequences=1, n_ctx_per_sequence=512, n_threads=2, should_abort=lambda: True)
    try:
        tokens = model.tokenize("hello world " * 100, add_special=False, parse_special=False)[:256]
        with pytest.raises(DecodeAborted):
            context.decode(tokens, start_pos=0, sequence=0, logits_for_last=True)
        context.remove(0, 0, -1)
        assert context.max_position(0) == -1
    finally:
        context.close()
        model.close()


def test_prompt_longer_than_the_context_is_refused(engine: Engine) -> None:
    too_long = tuple([engine.model.bos_id] * engine.info.n_ctx_per_sequence)
    with pytest.raises(ContextOverflowError, match="context holds"):
        engine.generate(GenerationRequest(too_long, GREEDY))


def test_engine_reports_its_shape(engine: Engine) -> None:
    info = engine.info
    assert info.n_sequences == 2
    assert info.n_ctx_per_sequence == 1024
    assert info.n_ctx_train == 8192
    assert not info.flash_attention  # off by default: it is not batch-invariant


@pytest.mark.parametrize(
    "question",
    ["Explain photosynthesis briefly.", "List three prime numbers and why.", "Give me a tip for writing clearly."],
)
def test_a_follow_up_that_continues_the_live_answer_equals_a_cold_run(engine: Engine, question: str) -> None:
    """The answer's KV, first computed one token at a time, is recomputed in batches while the
    user reads: a next turn reusing it in place is the computation a cold run of its prompt does."""
    first_prompt, answer, prompt = _question_and_follow_up(engine, question)
    engine.flush_cache()  # the user reads the answer: the engine recomputes it meanwhile
    warm = run(engine, prompt, FOLLOW_UP_SAMPLING, sequence=0)
    cold = run(engine, prompt, FOLLOW_UP_SAMPLING, sequence=1, use_cache=False)
    assert warm.stats.reuse_tier == "device"
    assert warm.stats.reused_tokens > len(first_prompt) + answer.stats.generated_tokens // 2
    assert warm.token_ids == cold.token_ids


def test_a_follow_up_sent_at_once_comes_before_the_recompute_and_still_equals_a_cold_run(engine: Engine) -> None:
    """A request that arrives while the last answer waits to be recomputed goes first: the answer's
    tokens are cut and computed with the new prompt, never reused as decoded one at a time."""
    first_prompt, answer, prompt = _question_and_follow_up(engine, "Explain photosynthesis briefly.")
    warm = run(engine, prompt, FOLLOW_UP_SAMPLING, sequence=0)  # no pause: sent as the answer ends
    cold = run(engine, prompt, FOLLOW_UP_SAMPLING, sequence=1, use_cache=False)
    least = on_grid(len(first_prompt) - 2, engine.info.prompt_grid)  # whole grid batches where on one
    assert least <= warm.stats.reused_tokens < len(first_prompt) + answer.stats.generated_tokens
    assert warm.token_ids == cold.token_ids


FOLLOW_UP_SAMPLING = SamplingParams(temperature=0.0, max_tokens=64)


def _question_and_follow_up(engine: Engine, question: str) -> tuple[tuple[int, ...], GenerationResult, tuple[int, ...]]:
    """Ask `question` in sequence 0; the first prompt, its answer, and a follow-up prompt continuing it."""
    first = [ChatMessage.of(Role.SYSTEM, "You are helpful."), ChatMessage.of(Role.USER, question)]
    first_prompt = tuple(engine.prompt_builder.build(first))
    answer = run(engine, first_prompt, FOLLOW_UP_SAMPLING, sequence=0)
    assert answer.stats.generated_tokens > 2
    follow_up = [
        *first,
        ChatMessage(role=Role.ASSISTANT, parts=(answer.text,), generated_ids=answer.token_ids),
        ChatMessage.of(Role.USER, "Now say it differently, in more detail."),
    ]
    return first_prompt, answer, tuple(engine.prompt_builder.build(follow_up))
