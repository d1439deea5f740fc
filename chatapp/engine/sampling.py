"""Picking each answer token from the logits: llama.cpp's sampler chain, with the grammar checked after.

A grammar masks every token it refuses, and checking all of them costs: on a model with a
262,144-token vocabulary (Gemma 3) the grammar in the chain took 34 ms a token, several times the
decode itself. llama-server checks only the token the chain picked and masks the whole vocabulary
only when the grammar refuses that one (common_sampler_sample); so does this sampler. The token
is the same: greedy picks the best token the grammar allows either way, and a random pick redrawn
from the masked tokens after a refusal has the masked distribution.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import llama_cpp
import numpy as np

from chatapp.engine.llama_native import NativeContext, NativeModel, grammar_sampler
from chatapp.engine.requests import SamplingParams
from chatapp.errors import GrammarError

# llama_token_data, as numpy lays it out: the candidates are filled from the logits without a Python loop.
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
# A greedy pick the grammar refused: the best tokens are checked one by one, in order, before the
# whole vocabulary is masked (the first the grammar allows is the one masking would give).
GREEDY_TRIES = 64


class NativeSampler:
    """A llama.cpp sampler chain built from `SamplingParams`, and the answer's grammar beside it."""

    def __init__(self, params: SamplingParams, model: NativeModel) -> None:
        if params.ignore_eos and params.grammar is not None:
            # A complete grammar allows only the end tokens: with those banned, llama.cpp aborts the process.
            raise ValueError("ignore_eos cannot be combined with a grammar")
        self.grammar: Any = grammar_sampler(params.grammar, model) if params.grammar is not None else None
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        self.pointer = llama_cpp.llama_sampler_chain_init(chain_params)
        self._n_vocab = model.n_vocab
        self._candidates: np.ndarray | None = None  # every token's logit, made at the first check
        self._ids = np.empty(0, dtype=np.int32)
        self._greedy = params.temperature <= 0
        if params.ignore_eos:
            llama_cpp.llama_sampler_chain_add(self.pointer, _end_ban(model))
        if params.temperature <= 0:
            llama_cpp.llama_sampler_chain_add(self.pointer, llama_cpp.llama_sampler_init_greedy())
            return
        seed = params.seed if params.seed is not None else llama_cpp.LLAMA_DEFAULT_SEED
        if params.top_k > 0:
            llama_cpp.llama_sampler_chain_add(self.pointer, llama_cpp.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            llama_cpp.llama_sampler_chain_add(self.pointer, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        llama_cpp.llama_sampler_chain_add(self.pointer, llama_cpp.llama_sampler_init_temp(params.temperature))
        llama_cpp.llama_sampler_chain_add(self.pointer, llama_cpp.llama_sampler_init_dist(seed))

    def sample(self, context: NativeContext, row: int = -1) -> int:
        """Pick a token from the logits of output `row` of the last decode (its last by default), and accept it."""
        if self.grammar is None:
            return int(llama_cpp.llama_sampler_sample(self.pointer, context.pointer, row))
        logits = context.logits(row)
        # Greedy's choice is the first highest logit (the chain holds nothing else: no ban beside a grammar).
        token = int(np.argmax(logits)) if self._greedy else self._pick(logits, masked=False)
        if not self.allows(token):
            best = self._best_allowed(logits) if self._greedy else None
            token = best if best is not None else self._pick(logits, masked=True)
            if not self.allows(token):  # every token the grammar allows is impossible: accepting aborts llama.cpp
                raise GrammarError("the grammar allows no token the model can write here")
        self.accept(token)
        return token

    def allows(self, token: int) -> bool:
        """Whether the grammar (if any) lets `token` come next."""
        if self.grammar is None:
            return True
        data = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0.0, 0.0))
        candidates = llama_cpp.llama_token_data_array(data, 1, -1, False)
        llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(candidates))
        return not math.isinf(data[0].logit)

    def accept(self, token: int) -> None:
        """`token` comes next: the grammar and the chain move on (never one the grammar refuses: llama.cpp
        aborts the process on one)."""
        if self.grammar is not None:
            llama_cpp.llama_sampler_accept(self.grammar, token)
        llama_cpp.llama_sampler_accept(self.pointer, token)

    def _best_allowed(self, logits: np.ndarray) -> int | None:
        """The greedy pick among the tokens the grammar allows, when it is among the GREEDY_TRIES best."""
        tries = min(GREEDY_TRIES, logits.size)
        best = np.argpartition(-logits, tries - 1)[:tries]
        # Tokens tied with the last one tried may have been left out, lower ids among them: from there on
        # only the whole vocabulary tells which one greedy takes.
        floor = logits[best].min()
        for token in best[np.lexsort((best, -logits[best]))]:  # highest first; a tie to the lower id, as greedy
            if not logits[token] > floor:  # (a NaN too)
                return None
            if self.allows(int(token)):
                return int(token)
        return None

    def _pick(self, logits: np.ndarray, *, masked: bool) -> int:
        """The chain's choice among every token (`masked`: those the grammar allows), not accepted yet."""
        if self._candidates is None:
            self._candidates = np.zeros(self._n_vocab, dtype=TOKEN_DATA)
            self._ids = np.arange(self._n_vocab, dtype=np.int32)
        candidates = self._candidates
        candidates["id"] = self._ids  # the chain may have reordered them
        candidates["logit"] = logits
        candidates["p"] = 0.0
        array = llama_cpp.llama_token_data_array(
            candidates.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), self._n_vocab, -1, False
        )
        if masked:
            llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(array))
        llama_cpp.llama_sampler_apply(self.pointer, ctypes.byref(array))
        if not 0 <= array.selected < array.size:
            raise GrammarError("the sampler chose no token")
        return int(array.data[array.selected].id)

    def close(self) -> None:
        for pointer in (self.grammar, self.pointer):
            if pointer:
                llama_cpp.llama_sampler_free(pointer)
        self.grammar = self.pointer = None


def _end_ban(model: NativeModel) -> Any:
    """A logit bias of minus infinity on every end-of-generation token: the answer runs to its length."""
    ends = model.end_of_generation_ids
    biases = (llama_cpp.llama_logit_bias * len(ends))()
    for slot, token in zip(biases, ends, strict=True):
        slot.token, slot.bias = token, float("-inf")
    return llama_cpp.llama_sampler_init_logit_bias(model.n_vocab, len(ends), biases)
