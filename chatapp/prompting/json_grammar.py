"""JSON schemas as llama.cpp grammars (GBNF), refusing by name what a grammar cannot hold.

llama-cpp-python's schema converter writes the rules. It ignores some keywords silently
(numeric bounds, `not`, `uniqueItems`...), and an answer that only looks constrained is
worse than a clear refusal, so those are refused before it runs.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from llama_cpp.llama_grammar import SchemaConverter

from chatapp.errors import GrammarError
from chatapp.prompting.grammar import Grammar

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
# Keywords the converter reads a value's kind from; without one, a schema's type is implied by its other
# keywords (IMPLIED_TYPES), or it allows any value.
TYPING_KEYWORDS = frozenset({"type", "$ref", "oneOf", "anyOf", "allOf", "const", "enum", "properties", "pattern"})
IMPLIED_TYPES = {
    "string": frozenset({"minLength", "maxLength", "format"}),
    "array": frozenset({"items", "prefixItems", "minItems", "maxItems"}),
    "object": frozenset({"required", "additionalProperties"}),
}
ANY_VALUE = "value"  # the converter's own rule for any JSON value, named as a type
# Lengths and counts a grammar holds: the converter writes a bound of n as n nested rules, and llama.cpp
# walks them recursively (Claude Code's Write tool allows 524,288 characters: the engine thread's stack
# overflowed). A larger bound is left to the client in a tool's parameters, refused in a response format.
LARGEST_BOUND = 512  # llama.cpp 0.3.36 parsed 1,000 nested rules and refused 1,024
BOUNDS = ("minLength", "maxLength", "minItems", "maxItems")
CONVERTER_CHAR = 'char ::= [^"\\\\] |'
JSON_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'

REF_RULE_CHARACTERS = re.compile(r"[^A-Za-z0-9-]+")  # what a rule's name may not hold
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

    def schema_rule(self, schema: dict[str, Any], name: str, where: str, *, tool: bool = False) -> str:
        """The name of the rule for values that follow `schema`; GrammarError naming what it cannot hold.

        A `tool`'s parameters keep what a grammar cannot enforce to the client: the rule holds the rest,
        and agents validate a call before they run it (Claude Code's own tools bound numbers with
        `minimum`). An answer's own format is refused by the keyword's name instead: it is the output.
        """
        refuse_malformed(schema, where)
        try:
            if tool:
                schema = enforceable_part(schema)
            else:
                refuse_unsupported(schema, where)
                refuse_large_bounds(schema, where)
            schema = any_value_where_untyped(schema)
            resolved = resolve_local_refs(self._converter, schema, where)
            rule: str = self._converter.visit(resolved, name)
        except GrammarError:
            raise
        except Exception as error:  # the converter asserts and raises plain errors on schemas it cannot read
            raise GrammarError(f"{where} cannot be turned into a grammar ({error}); simplify the schema") from None
        return rule

    def add(self, name: str, rule: str) -> None:
        self._extra[name] = rule

    def gbnf(self) -> str:
        mend_additional_properties(self._converter._rules)
        lines = [f"{name} ::= {rule}" for name, rule in self._extra.items()]
        # JSON strings hold no raw control characters (json.loads refuses them): the converter's rule allows them.
        converted = self._converter.format_grammar().replace(CONVERTER_CHAR, JSON_CHAR)
        return "\n".join([*lines, converted])


def resolve_local_refs(converter: SchemaConverter, schema: dict[str, Any], where: str) -> dict[str, Any]:
    """A copy of `schema` whose every `$ref` (`#`, `#/$defs/...`) names a rule of its own, registered with
    the converter, in the schemas references point to as well, so a schema may refer to itself (a
    Pydantic model holding a list of itself). The converter's own `resolve_refs` does not look inside
    what a reference points to, and names a reference's rule after its last part alone, so two schemas'
    `#/$defs/Node` would share one rule."""
    copied: dict[str, Any] = copy.deepcopy(schema)
    registered: dict[str, Any] = converter._refs
    rules: dict[str, str] = {}  # this schema's references -> their rules' names

    def target_of(ref: str) -> Any:
        target: Any = copied
        for part in ref.removeprefix("#").split("/")[1:] if ref != "#" else ():
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise GrammarError(f"{where} refers to {ref!r}, which names nothing in the schema; fix the $ref")
            target = target[part]
        return target

    def visit(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                visit(item)
            return
        if not isinstance(node, dict):
            return
        ref = node.get("$ref")
        if isinstance(ref, str):
            if ref != "#" and not ref.startswith("#/"):
                raise GrammarError(
                    f"{where} refers to {ref!r}: only references inside the schema by path (#/$defs/...) count"
                )
            if ref not in rules:
                rules[ref] = _unused_name(
                    REF_RULE_CHARACTERS.sub("-", f"{where}-{ref}").strip("-") or "ref", registered
                )
                registered[rules[ref]] = target_of(ref)
            node["$ref"] = rules[ref]
        for key, value in node.items():
            if key != "$ref":
                visit(value)

    visit(copied)
    return copied


def mend_additional_properties(rules: dict[str, str]) -> None:
    """The converter writes an object whose properties are all optional and that allows other keys as
    `"{" (a-kv a-rest | additional-kvs)? "}"` with `a-rest ::= additional-kvs`: after `a` it then demands
    other keys, with no comma before them (`{"a": 1 "b": 2}`, which no JSON reader takes). After an
    optional property the other keys are optional and follow a comma."""
    for name, rule in rules.items():
        if name.endswith("-rest") and rule.endswith("additional-kvs") and rule in rules:
            rules[name] = f'( "," space {rule} )?'


def _unused_name(name: str, taken: dict[str, Any]) -> str:
    """`name`, or with a number after it where another reference has it (`a_b` and `a-b` read alike)."""
    number = 0
    found = name
    while found in taken:
        number += 1
        found = f"{name}-{number}"
    return found


def refuse_unsupported(schema: Any, where: str) -> None:
    """GrammarError naming the first keyword in `schema` that a grammar would not enforce."""
    for path, keyword in _keywords(schema, where):
        if keyword in UNSUPPORTED_KEYWORDS:
            raise GrammarError(
                f"{path} uses {keyword!r}, which this server cannot enforce while generating; remove it from the schema"
            )


def enforceable_part(schema: Any) -> Any:
    """`schema` without the keywords a grammar would not enforce (bounds past LARGEST_BOUND among them), in it
    and in the schemas inside it."""
    return _each_schema(schema, lambda one: {key: value for key, value in one.items() if _enforceable(key, value)})


def _enforceable(keyword: str, value: Any) -> bool:
    if keyword in UNSUPPORTED_KEYWORDS:
        return False
    return keyword not in BOUNDS or not isinstance(value, int) or value <= LARGEST_BOUND


def refuse_large_bounds(schema: Any, where: str) -> None:
    """GrammarError naming the first length or count in `schema` past what a grammar holds."""

    def check(one: dict[str, Any]) -> dict[str, Any]:
        for keyword in BOUNDS:
            value = one.get(keyword)
            if isinstance(value, int) and value > LARGEST_BOUND:
                raise GrammarError(
                    f"{where} has {keyword} {value:,}; a grammar holds at most {LARGEST_BOUND:,}: "
                    "lower it, or leave it out"
                )
        return one

    _each_schema(schema, check)


def any_value_where_untyped(schema: Any) -> Any:
    """`schema` with each schema that names no type read as JSON Schema reads it: the type its keywords imply
    (`minLength` a string, `required` an object...), else any JSON value (the converter would take `{}` for an
    object and refuse a lone description or `minLength`)."""
    return _each_schema(schema, _typed)


def _typed(one: dict[str, Any]) -> dict[str, Any]:
    if TYPING_KEYWORDS & one.keys():
        return one
    implied = next((kind for kind, keywords in IMPLIED_TYPES.items() if keywords & one.keys()), ANY_VALUE)
    return {**one, "type": implied}


def _each_schema(schema: Any, change: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """`schema` with `change` applied to it and to every schema inside it (the inner ones first)."""
    if schema is True:  # JSON Schema's `true`: any value
        schema = {}
    if not isinstance(schema, dict):
        return schema
    inside = dict(schema)
    for field in SCHEMA_MAPS:
        if isinstance(inside.get(field), dict):
            inside[field] = {name: _each_schema(inner, change) for name, inner in inside[field].items()}
    for field in (*SCHEMA_LISTS, *SCHEMA_VALUES):
        inner = inside.get(field)
        if isinstance(inner, list):
            inside[field] = [_each_schema(item, change) for item in inner]
        elif isinstance(inner, dict) or inner is True:
            inside[field] = _each_schema(inner, change)
    return change(inside)


def _keywords(schema: Any, path: str) -> Iterator[tuple[str, str]]:
    """(path, keyword) for every keyword of `schema` and of the schemas inside it."""
    for place, one in _schemas(schema, path):
        for keyword in one if isinstance(one, dict) else ():
            yield place, keyword


def _schemas(schema: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(path, value) for `schema` and every place inside it that holds a schema, whatever the value there is."""
    yield path, schema
    if not isinstance(schema, dict):
        return
    for field in SCHEMA_MAPS:
        inner_map = schema.get(field)
        for name, inner in inner_map.items() if isinstance(inner_map, dict) else ():
            yield from _schemas(inner, f"{path}.{field}.{name}")
    for field in (*SCHEMA_LISTS, *SCHEMA_VALUES):
        inner = schema.get(field)
        if isinstance(inner, list):
            for index, item in enumerate(inner):
                yield from _schemas(item, f"{path}.{field}[{index}]")
        elif field in SCHEMA_VALUES and field in schema:
            yield from _schemas(inner, f"{path}.{field}")


def refuse_malformed(schema: Any, where: str) -> None:
    """GrammarError naming the first place in `schema` that holds something else than a schema where one
    belongs (a schema is an object, or true or false), or a map or list of them written as another value."""
    for path, one in _schemas(schema, where):
        if isinstance(one, bool) or (one is None and path != where):  # a keyword set to null: as if left out
            continue
        if not isinstance(one, dict):
            raise GrammarError(f"{path} is {type(one).__name__} {_shown(one)}; a schema is a JSON object (or true)")
        for field in SCHEMA_MAPS:  # null, or [] (an empty map as some JSON writers write it), is no schema at all
            if one.get(field) not in (None, []) and not isinstance(one[field], dict):
                raise GrammarError(f"{path}.{field} must be an object of schemas by name")
        for field in SCHEMA_LISTS:
            if one.get(field) is not None and not isinstance(one[field], list):
                raise GrammarError(f"{path}.{field} must be a list of schemas")


def _shown(value: Any) -> str:
    written = json.dumps(value, ensure_ascii=False, default=str)
    return written if len(written) <= 40 else written[:39] + "…"


def schema_grammar(schema: dict[str, Any], where: str) -> Grammar:
    """A grammar whose root (ROOT) is one JSON value following `schema` (structured output)."""
    rules = RuleSet()
    value = rules.schema_rule(schema, "chatapp-value", where)
    rules.add(ROOT, value)
    return Grammar(rules.gbnf(), root=ROOT)
