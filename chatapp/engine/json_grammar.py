"""JSON schemas as llama.cpp grammars (GBNF), refusing by name what a grammar cannot hold.

llama-cpp-python's schema converter writes the rules. It ignores some keywords silently
(numeric bounds, `not`, `uniqueItems`...), and an answer that only looks constrained is
worse than a clear refusal, so those are refused before it runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from llama_cpp.llama_grammar import SchemaConverter

from chatapp.engine.grammar import Grammar
from chatapp.errors import GrammarError

# Keywords the converter would ignore: the answer could break them.
UNSUPPORTED_KEYWORDS = frozenset(
    {
        "not",
        "if",
        "then",
        "else",
        "patternProperties",
        "propertyNames",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "unevaluatedProperties",
        "unevaluatedItems",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "minProperties",
        "maxProperties",
        "multipleOf",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
    }
)
SCHEMA_MAPS = ("properties", "$defs", "definitions")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_VALUES = ("items", "additionalProperties")

# Our own rules' names begin with "chatapp-": the converter names its rules after the schema's.
ROOT = "chatapp-root"
# Any JSON object (OpenAI's json_object mode, Ollama's format "json").
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def literal(text: str) -> str:
    """`text` as a GBNF string literal."""
    return json.dumps(text, ensure_ascii=False)


def anything_but(closing: str) -> str:
    """GBNF alternatives for one piece of text that cannot begin `closing`: a character that is not its
    first, or each beginning of it followed by a character that does not go on with it."""
    pieces = [f"[^{_class_character(closing[0])}]"]
    for length in range(1, len(closing)):
        pieces.append(f"{literal(closing[:length])} [^{_class_character(closing[length])}]")
    return " | ".join(pieces)


def _class_character(character: str) -> str:
    return "\\" + character if character in "\\]^-" else character


class RuleSet:
    """Grammar rules built from several schemas, each under its own name, written out once."""

    def __init__(self) -> None:
        self._converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        self._extra: dict[str, str] = {}

    def schema_rule(self, schema: dict[str, Any], name: str, where: str) -> str:
        """The name of the rule for values that follow `schema`; GrammarError naming what it cannot hold."""
        try:
            refuse_unsupported(schema, where)
            resolved = self._converter.resolve_refs(schema, where)
            rule: str = self._converter.visit(resolved, name)
        except GrammarError:
            raise
        except Exception as error:  # the converter asserts and raises plain errors on schemas it cannot read
            raise GrammarError(f"{where} cannot be turned into a grammar ({error}); simplify the schema") from None
        return rule

    def add(self, name: str, rule: str) -> None:
        self._extra[name] = rule

    def gbnf(self) -> str:
        lines = [f"{name} ::= {rule}" for name, rule in self._extra.items()]
        return "\n".join([*lines, self._converter.format_grammar()])


def refuse_unsupported(schema: Any, where: str) -> None:
    """GrammarError naming the first keyword in `schema` that a grammar would not enforce."""
    for path, keyword in _keywords(schema, where):
        if keyword in UNSUPPORTED_KEYWORDS:
            raise GrammarError(
                f"{path} uses {keyword!r}, which this server cannot enforce while generating; remove it from the schema"
            )


def _keywords(schema: Any, path: str) -> Iterator[tuple[str, str]]:
    """(path, keyword) for every keyword of `schema` and of the schemas inside it."""
    if not isinstance(schema, dict):
        return
    for keyword in schema:
        yield path, keyword
    for field in SCHEMA_MAPS:
        inner_map = schema.get(field)
        for name, inner in inner_map.items() if isinstance(inner_map, dict) else ():
            yield from _keywords(inner, f"{path}.{field}.{name}")
    for field in SCHEMA_LISTS:
        inner_list = schema.get(field)
        for index, inner in enumerate(inner_list if isinstance(inner_list, list) else ()):
            yield from _keywords(inner, f"{path}.{field}[{index}]")
    for field in SCHEMA_VALUES:
        inner = schema.get(field)
        if isinstance(inner, list):
            for index, item in enumerate(inner):
                yield from _keywords(item, f"{path}.{field}[{index}]")
        else:
            yield from _keywords(inner, f"{path}.{field}")


def schema_grammar(schema: dict[str, Any], where: str) -> Grammar:
    """A grammar whose root (ROOT) is one JSON value following `schema` (structured output)."""
    rules = RuleSet()
    value = rules.schema_rule(schema, "chatapp-value", where)
    rules.add(ROOT, value)
    return Grammar(rules.gbnf(), root=ROOT)
