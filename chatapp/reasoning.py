"""How much a reasoning model thinks before it answers, as a request asks: every API's switch in one form.

OpenAI's `reasoning_effort` (and the Responses API's `reasoning.effort`), Anthropic's `thinking`
and Ollama's `think` all become a `Reasoning`, which the prompt hands to the model's chat template
as the variables reasoning templates read: Qwen 3's `enable_thinking`, gpt-oss's
`reasoning_effort`. A template that reads neither renders as without them: the switch is a
no-op on a model without one, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EFFORTS = ("low", "medium", "high")
LEAST_EFFORT = "low"  # gpt-oss cannot stop reasoning: asked for none, it reasons least


@dataclass(frozen=True)
class Reasoning:
    """Reasoning on or off, and how hard when on."""

    enabled: bool
    effort: str = "medium"

    def template_variables(self) -> tuple[tuple[str, Any], ...]:
        return (("enable_thinking", self.enabled), ("reasoning_effort", self.effort if self.enabled else LEAST_EFFORT))


REASONING_OFF = Reasoning(False)
