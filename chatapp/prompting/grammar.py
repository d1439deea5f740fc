"""The grammar an answer may be held to (its own module: prompts and requests both name it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# llama-server's grammar trigger types (common_grammar_trigger_type): a word, or a regular
# expression the whole text so far must match (the grammar takes it from the first group on).
TRIGGER_WORD = 1
TRIGGER_PATTERN_FULL = 3
REGEX_SPECIALS = frozenset("\\^$.|?*+()[]{}")


def regex_literal(text: str) -> str:
    """`text` as a regular expression that matches it alone, in the ECMAScript syntax llama.cpp's
    std::regex reads (only its special characters escaped: an escaped space or quote is not valid there)."""
    return "".join(f"\\{character}" if character in REGEX_SPECIALS else character for character in text)


@dataclass(frozen=True)
class Grammar:
    """A llama.cpp grammar (GBNF) the answer must follow: a tool call, a JSON object.

    With `triggers` it is lazy: the answer is free until one of these texts appears, and the
    grammar holds from that text on (it must begin with it). A grammar changes sampling
    only, never the prompt, so it costs no cache hit.

    `preserved`: texts the grammar names that are special tokens in some vocabularies (Mistral's
    `[TOOL_CALLS]`). llama.cpp's grammar and its triggers see a special token as its text, but an
    answer's text leaves special tokens out; these are shown as their text, so the calls can be read
    (llama-server's `preserved_tokens`).
    """

    gbnf: str
    triggers: tuple[str, ...] = ()
    root: str = "root"
    patterns: tuple[str, ...] = ()  # triggers as regular expressions (what a client of /completion sent)
    preserved: tuple[str, ...] = ()

    @property
    def lazy(self) -> bool:
        return bool(self.triggers or self.patterns)

    def trigger_patterns(self) -> tuple[str, ...]:
        """Every trigger as a pattern the whole text so far must match; the grammar takes it from the group."""
        words = tuple(f"[\\s\\S]*?({regex_literal(trigger)})[\\s\\S]*" for trigger in self.triggers)
        return words + self.patterns

    def whole_text_patterns(self) -> tuple[str, ...]:
        """The trigger patterns anchored at both ends, as llama-server anchors whole-text patterns: given
        to llama.cpp's grammar as they are, a pattern without `^...$` is searched for anywhere (a
        trigger meant for the start would fire inside a text) and costs time that grows with the
        square of the answer's length at every token."""
        return tuple(
            ("" if pattern.startswith("^") else "^") + pattern + ("" if pattern.endswith("$") else "$")
            for pattern in self.trigger_patterns()
        )

    def server_fields(self) -> dict[str, Any]:
        """The grammar in llama-server's /completion fields (its grammars start at a rule named root)."""
        gbnf = self.gbnf if self.root == "root" else f"{self.gbnf}\nroot ::= {self.root}"
        fields: dict[str, Any] = {"grammar": gbnf}
        if self.preserved:
            fields["preserved_tokens"] = list(self.preserved)
        if self.lazy:
            fields["grammar_lazy"] = True
            fields["grammar_triggers"] = [
                {"type": TRIGGER_PATTERN_FULL, "value": pattern} for pattern in self.trigger_patterns()
            ]
        return fields
