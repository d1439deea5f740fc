"""A schema that is not one is refused in words that name the place, before the converter sees it."""

from __future__ import annotations

from typing import Any

import pytest

from chatapp.errors import GrammarError
from chatapp.prompting.json_grammar import RuleSet


@pytest.mark.parametrize(
    ("schema", "said"),
    [
        ({"type": "object", "properties": {"path": ["string"]}}, "params.properties.path is list"),
        ({"type": "object", "properties": ["path"]}, "params.properties must be an object of schemas"),
        ({"anyOf": {"type": "string"}}, "params.anyOf must be a list of schemas"),
        ({"type": "array", "items": "string"}, 'params.items is str "string"'),
        ({"anyOf": [{"type": "string"}, 3]}, "params.anyOf[1] is int 3"),
    ],
)
@pytest.mark.parametrize("tool", [True, False])
def test_a_malformed_schema_is_refused_in_words_naming_the_place(schema: dict[str, Any], said: str, tool: bool) -> None:
    with pytest.raises(GrammarError) as refused:
        RuleSet().schema_rule(schema, "value", "params", tool=tool)
    assert said in str(refused.value)
    assert "attribute" not in str(refused.value)


def test_schemas_of_true_legacy_item_lists_and_null_or_empty_keywords_still_compile() -> None:
    rules = RuleSet()
    assert rules.schema_rule({"type": "object", "additionalProperties": True}, "a", "p", tool=True)
    assert rules.schema_rule({"type": "array", "items": [{"type": "string"}]}, "b", "p", tool=True)
    loose: dict[str, Any] = {
        "type": "object",
        "additionalProperties": None,
        "$defs": [],
        "definitions": None,
    }  # as PHP writes them
    assert rules.schema_rule(loose, "c", "p", tool=True)
