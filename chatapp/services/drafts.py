"""What is typed so far, as prompt tokens: the settled part of a draft after the conversation.

Warm-ahead computes these while the user types, and the checkpoints of models whose state
cannot be cut sit at the same places (boundaries.py), so both take them from here.
"""

from __future__ import annotations

from chatapp.prompting.prompt import ChatMessage, PromptBuilder
from chatapp.vocabulary import Role


def settled_text(draft: str) -> str:
    """The part of a message being typed that will not change: up to its last whitespace.

    The word after it is still being typed; the whitespace before it is kept, since the
    tokenizer may fold it into that word's first token (which is why callers warm all but
    the last token of the settled text).
    """
    for index in range(len(draft) - 1, -1, -1):
        if draft[index].isspace():
            return draft[: index + 1]
    return ""


def draft_prompt_tokens(
    builder: PromptBuilder, messages: list[ChatMessage], parts_before: tuple[str, ...], draft: str
) -> list[int]:
    """What to warm while `draft` is typed after `messages` (`parts_before`: e.g. the document block)."""
    settled = settled_text(draft)
    tokens = builder.draft_tokens(messages, ChatMessage.of(Role.USER, *parts_before, settled))
    # The token at the boundary may merge with what is typed next: leave it to the real request.
    return tokens[:-1] if settled else tokens
