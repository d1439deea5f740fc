"""What a caller asks of an engine: the prompt's tokens, how to sample, and hints for reuse.

These types are the same for every engine behind the contract (contract.py): the local
llama.cpp engine and a remote server alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from chatapp.prompting.grammar import Grammar
from chatapp.prompting.prompt import ChatMessage


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen; temperature 0 is greedy and reproducible."""

    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 0  # 0: no top-k cut (Anthropic's and Ollama's top_k)
    seed: int | None = None
    max_tokens: int | None = 512  # None: until the end of generation or of the context
    grammar: Grammar | None = None
    # True: the end-of-generation tokens are never sampled, so the answer runs to max_tokens or the
    # context's end (llama-server's and vLLM's `ignore_eos`): answers of a known length for benchmarks
    # and tests, whatever the model would write on this CPU.
    ignore_eos: bool = False


@dataclass(frozen=True)
class GenerationRequest:
    """One answer to compute: the full prompt tokens, sampling, and the sequence to use.

    `prefill_only` computes the prompt's KV ahead of the real request (warming up while the
    user types) and samples nothing: it ends with StopReason.PREFILLED and is left out of the
    cache's hit rate. `store=False` keeps the KV resident but hands nothing to the cache's
    RAM and disk tiers, so half-typed drafts do not fill the disk. `checkpoints` are prompt
    positions where reuse is likely to start (the end of the persona, of a document, of
    the history): a model whose state cannot be cut is checkpointed there. `messages` are
    what the prompt was built from: an engine whose server builds its own prompts (a chat API)
    takes these instead of tokens, and `prompt_tokens` is then empty.
    """

    prompt_tokens: tuple[int, ...]
    sampling: SamplingParams
    sequence: int | None = None  # None: the engine picks (the best resident or cached prefix)
    use_cache: bool = True  # False: no lookup, no store; the whole prompt is computed
    prefill_only: bool = False
    store: bool = True
    checkpoints: tuple[int, ...] = ()
    messages: tuple[ChatMessage, ...] = ()
    # Text that ends the answer's turn where the model writes it as text (a model without a chat template,
    # given ChatML): the reader ends the answer before it, as at an end token (services/answer_run.py).
    turn_ends: tuple[str, ...] = ()
