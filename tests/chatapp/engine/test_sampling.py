"""The grammar checked after the chain's pick: the same tokens as the grammar masking every token first."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial

import llama_cpp
import numpy as np
import pytest

from chatapp.engine import sampling
from chatapp.engine.llama_native import NativeContext, NativeModel, grammar_sampler
from chatapp.engine.requests import SamplingParams
from chatapp.engine.sampling import NativeSampler
from chatapp.prompting.grammar import Grammar

# A shape the model's own first choice often breaks: both ways of picking are exercised.
RECORD = Grammar(r'root ::= "{\"city\": \"" [A-Z] [a-z]{2,12} "\", \"year\": " [1-2] [0-9]{3} "}"')
PROMPT = "<|im_start|>user\nName a city and the year it was founded.<|im_end|>\n<|im_start|>assistant\n"


def answer(model: NativeModel, context: NativeContext, pick: Callable[[], int]) -> list[int]:
    """Tokens until the end or 40, each chosen by `pick` from the last decode's logits."""
    prompt = model.tokenize(PROMPT, add_special=True, parse_special=True)
    context.remove(0, 0, -1)
    context.decode(prompt, start_pos=0, sequence=0, logits_for_last=True)
    tokens: list[int] = []
    while len(tokens) < 40:
        token = pick()
        if model.is_end_of_generation(token):
            break
        tokens.append(token)
        context.decode([token], start_pos=len(prompt) + len(tokens) - 1, sequence=0, logits_for_last=True)
    return tokens


@pytest.mark.parametrize("tries", [sampling.GREEDY_TRIES, 1], ids=["best tokens tried first", "masked at once"])
def test_a_greedy_answer_under_a_grammar_is_the_one_the_masked_vocabulary_gives(
    loaded: tuple[NativeModel, NativeContext], monkeypatch: pytest.MonkeyPatch, tries: int
) -> None:
    monkeypatch.setattr(sampling, "GREEDY_TRIES", tries)
    model, context = loaded
    masked_first = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(masked_first, grammar_sampler(RECORD, model))
    llama_cpp.llama_sampler_chain_add(masked_first, llama_cpp.llama_sampler_init_greedy())
    checked_after = NativeSampler(SamplingParams(temperature=0.0, grammar=RECORD), model)
    refusals = 0
    real_best = checked_after._best_allowed

    def counted(logits: np.ndarray) -> int | None:
        nonlocal refusals
        refusals += 1
        return real_best(logits)

    checked_after._best_allowed = counted  # type: ignore[method-assign]
    try:
        reference = answer(
            model, context, lambda: int(llama_cpp.llama_sampler_sample(masked_first, context.pointer, -1))
        )
        ours = answer(model, context, lambda: checked_after.sample(context))
    finally:
        llama_cpp.llama_sampler_free(masked_first)
        checked_after.close()
    assert ours == reference
    text = model.detokenize(ours)
    assert re.fullmatch(r'\{"city": "[A-Z][a-z]{2,12}", "year": [12][0-9]{3}\}', text), text
    assert refusals > 0  # the model's own pick was refused at least once: the path after a refusal ran too


def test_random_picks_under_a_grammar_always_keep_to_it(loaded: tuple[NativeModel, NativeContext]) -> None:
    model, context = loaded
    for seed in range(3):
        sampler = NativeSampler(SamplingParams(temperature=1.5, top_p=1.0, seed=seed, grammar=RECORD), model)
        try:
            text = model.detokenize(answer(model, context, partial(sampler.sample, context)))
        finally:
            sampler.close()
        assert re.fullmatch(r'\{"city": "[A-Z][a-z]{2,12}", "year": [12][0-9]{3}\}', text), text
