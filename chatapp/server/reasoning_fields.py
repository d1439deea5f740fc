"""Each API's reasoning switch read into one `Reasoning`: OpenAI's `reasoning_effort` (the Responses
API's `reasoning.effort`), Anthropic's `thinking` and Ollama's `think`. Absent: None (the model's
template decides); a value the API does not define: a 400 naming the field and its values."""

from __future__ import annotations

from typing import Any

from chatapp.reasoning import EFFORTS, REASONING_OFF, Reasoning
from chatapp.server.errors import ApiError

# OpenAI's efforts beyond low/medium/high, as the nearest one a template knows ("none": no reasoning).
OPENAI_EFFORTS = {"none": None, "minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}
# Anthropic's thinking budgets (tokens) below which an effort is the lower one.
BUDGET_EFFORTS = ((4096, "low"), (16384, "medium"))


def openai_reasoning(value: Any, param: str = "reasoning_effort") -> Reasoning | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in OPENAI_EFFORTS:
        raise ApiError(400, f"{param} is {value!r}; use one of {', '.join(OPENAI_EFFORTS)}", param=param)
    effort = OPENAI_EFFORTS[value]
    return Reasoning(True, effort) if effort is not None else REASONING_OFF


def responses_reasoning(value: Any) -> Reasoning | None:
    """The Responses API's `reasoning` object (`effort`; its `summary` asks for what chatapp does not write)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ApiError(400, "reasoning must be an object such as {'effort': 'low'}", param="reasoning")
    return openai_reasoning(value.get("effort"), "reasoning.effort")


def anthropic_thinking(value: Any) -> Reasoning | None:
    """`{"type": "enabled", "budget_tokens": N}` (the budget picks the effort), `disabled`, or `adaptive`."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "disabled":
        return REASONING_OFF
    if kind == "adaptive":
        return Reasoning(True)
    if kind == "enabled":
        budget = value.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ApiError(400, "thinking.budget_tokens must be a positive number of tokens", param="thinking")
        effort = next((effort for below, effort in BUDGET_EFFORTS if budget < below), "high")
        return Reasoning(True, effort)
    raise ApiError(
        400, "thinking.type must be 'enabled' (with budget_tokens), 'disabled' or 'adaptive'", param="thinking"
    )


def ollama_think(value: Any) -> Reasoning | None:
    """`true`, `false`, or an effort ("low", "medium", "high") as Ollama's gpt-oss takes it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return Reasoning(True) if value else REASONING_OFF
    if isinstance(value, str) and value in EFFORTS:
        return Reasoning(True, value)
    raise ApiError(400, f"think is {value!r}; use true, false, or one of {', '.join(EFFORTS)}", param="think")
