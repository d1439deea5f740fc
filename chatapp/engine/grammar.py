"""The grammar an answer may be held to (its own module: prompts and requests both name it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Grammar:
    """A llama.cpp grammar (GBNF) the answer must follow: a tool call, a JSON object.

    With `triggers` it is lazy: the answer is free until one of these texts appears, and the
    grammar holds from that text on (it must begin with it). A grammar changes sampling
    only, never the prompt, so it costs no cache hit.
    """

    gbnf: str
    triggers: tuple[str, ...] = ()
    root: str = "root"
