"""Where a later prompt is likely to leave this one: the places worth a checkpoint.

A model whose state cannot be cut (a sliding window, a recurrent state) can only resume
where the engine kept a checkpoint. Questions about one persona part after the persona,
questions about one document after the document, and the next turn after the history:
these are the positions a request names, computed exactly as the warm-ahead computes its
prefix, so a checkpoint sits where the next question's tokens begin.
"""

from __future__ import annotations

from chatapp.prompting.prompt import ChatMessage, PromptBuilder
from chatapp.services.drafts import draft_prompt_tokens
from chatapp.vocabulary import Role


def reuse_boundaries(builder: PromptBuilder, messages: list[ChatMessage]) -> tuple[int, ...]:
    """Token positions in the prompt of `messages` (the last one the new question) after the
    persona, after a document the question carries, and after the earlier turns."""
    if not messages:
        return ()
    history, question = messages[:-1], messages[-1]
    points: set[int] = set()
    if history and history[0].role is Role.SYSTEM:
        points.add(len(draft_prompt_tokens(builder, history[:1], (), "")))
    if len(history) > 1:
        points.add(len(draft_prompt_tokens(builder, history, (), "")))
    if question.role is Role.USER and len(question.parts) > 1:
        points.add(len(draft_prompt_tokens(builder, history, question.parts[:-1], "")))
    return tuple(sorted(point for point in points if point > 0))
