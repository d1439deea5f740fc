"""`ignore_eos`: the end-of-generation tokens are never sampled, so an answer runs to its length on every CPU."""

from __future__ import annotations

import pytest

from chatapp.engine.engine import Engine
from chatapp.engine.llama_native import NativeModel
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.engine.sampling import NativeSampler
from chatapp.prompting.grammar import Grammar
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import Role, StopReason
from tests.grammar_support import chain_allows

SHORT_ANSWER = "What is 2+2?"


def test_every_end_token_is_forbidden_and_nothing_else(vocab: NativeModel) -> None:
    ends = vocab.end_of_generation_ids
    # SmolLM2's: its EOS, ChatML's end of turn, and the end of text.
    named = {vocab.tokenize(text, add_special=False, parse_special=True)[0] for text in ("<|im_end|>", "<|endoftext|>")}
    assert {vocab.eos_id, *named} <= set(ends)
    assert len(ends) < 8
    banned = NativeSampler(SamplingParams(temperature=0.0, ignore_eos=True), vocab)
    free = NativeSampler(SamplingParams(temperature=0.0), vocab)
    try:
        assert not any(chain_allows(banned, token) for token in ends)
        assert all(chain_allows(free, token) for token in ends)
        others = [token for token in range(0, vocab.n_vocab, 97) if token not in ends]
        assert all(chain_allows(banned, token) for token in others)
    finally:
        banned.close()
        free.close()


def test_an_answer_that_ignores_the_end_runs_to_its_length_and_is_the_same_until_then(engine: Engine) -> None:
    # A question the model answers in about 11 tokens here; whether it ends before `length` on this CPU does
    # not change what must hold.
    prompt = tuple(engine.prompt_builder.build([ChatMessage.of(Role.USER, SHORT_ANSWER)]))
    length = 24
    free = engine.generate(GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=length))).wait()
    held = engine.generate(
        GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=length, ignore_eos=True))
    ).wait()
    assert held.stop_reason == StopReason.LENGTH
    assert len(held.token_ids) == held.stats.generated_tokens == length
    assert not any(engine.model.is_end_of_generation(token) for token in held.token_ids)
    # The ban changes only where the free answer ended: every token before it is the same.
    assert held.token_ids[: len(free.token_ids)] == free.token_ids


def test_an_answer_a_grammar_finishes_ends_by_itself(engine: Engine) -> None:
    """The other way an answer ends, forced on every CPU: once the grammar is complete only an end token is left."""
    prompt = tuple(engine.prompt_builder.build([ChatMessage.of(Role.USER, SHORT_ANSWER)]))
    sampling = SamplingParams(temperature=0.0, max_tokens=24, grammar=Grammar('root ::= "Four."'))
    result = engine.generate(GenerationRequest(prompt, sampling)).wait()
    assert result.stop_reason == StopReason.END
    assert result.text == "Four."


def test_ignore_eos_with_a_grammar_is_refused_before_anything_runs(vocab: NativeModel) -> None:
    with pytest.raises(ValueError, match="ignore_eos"):
        NativeSampler(SamplingParams(ignore_eos=True, grammar=Grammar('root ::= "Four."')), vocab)
