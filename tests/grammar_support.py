"""Walking a llama.cpp grammar token by token, as the sampler does while a model writes."""

from __future__ import annotations

import ctypes
import math

import llama_cpp

from chatapp.engine.llama_native import NativeModel
from chatapp.engine.requests import SamplingParams
from chatapp.engine.sampling import NativeSampler
from chatapp.prompting.grammar import Grammar


def chain_allows(sampler: NativeSampler, token: int) -> bool:
    """Whether the sampler's chain (its bans, not its grammar) leaves `token` a finite logit."""
    data = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0.0, 0.0))
    candidates = llama_cpp.llama_token_data_array(data, 1, -1, False)
    llama_cpp.llama_sampler_apply(sampler.pointer, ctypes.byref(candidates))
    return not math.isinf(data[0].logit)


def grammar_takes(vocab: NativeModel, grammar: Grammar, text: str, end: int, *, special: bool = True) -> bool:
    """Whether `grammar` takes the whole of `text` (tokenized with markers as special tokens, as a model
    writes them, or as plain text) and lets the answer end there with `end`."""
    sampler = NativeSampler(SamplingParams(temperature=0, grammar=grammar), vocab)
    try:
        for token in vocab.tokenize(text, add_special=False, parse_special=special):
            if not sampler.allows(token):
                return False
            sampler.accept(token)
        return sampler.allows(end)
    finally:
        sampler.close()
