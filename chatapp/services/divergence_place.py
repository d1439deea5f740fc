"""What a prompt changed where it left an earlier one: a line of the system prompt, the tools, a message.

The position alone (token 1,234) tells an agent's author little; the usual culprits are a
date or a file tree in the system prompt and a tool list that changed or came in another
order, so the place is named in those terms.
"""

from __future__ import annotations

from collections.abc import Sequence

from chatapp.prompting.prompt import ChatMessage, PromptBuilder
from chatapp.vocabulary import Role


def divergence_place(
    builder: PromptBuilder,
    messages: Sequence[ChatMessage],
    tokens: Sequence[int],
    position: int,
) -> str:
    """Where token `position` of the prompt built from `messages` lies, in words ("" when unknown).

    The message is found by bisection over the conversation's prefixes (their token counts only
    grow), built without touching the builder's memo.
    """

    def end_of(count: int) -> int:
        return len(builder.build(list(messages[:count]), add_generation_prompt=False, remember=False))

    low, high = 1, len(messages)
    if not messages or end_of(high) <= position:
        return "the answer's header"
    while low < high:  # the fewest messages whose tokens reach past `position`
        middle = (low + high) // 2
        if end_of(middle) > position:
            high = middle
        else:
            low = middle + 1
    index = low - 1
    message = messages[index]
    if index > 0 or message.role is not Role.SYSTEM or not builder.supports_system:
        return f"message {low} ({message.role.value})"
    end = end_of(1)
    turn = builder.detokenize(list(tokens[:end]))
    offset = len(builder.detokenize(list(tokens[:position])))
    persona = message.content
    start = turn.find(persona) if persona else -1
    if start >= 0 and start <= offset < start + len(persona):
        return f"line {persona[: offset - start].count(chr(10)) + 1} of the system prompt"
    return "the tools" if builder.tools else "the system prompt's template text"
