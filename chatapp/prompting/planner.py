"""One prompt planner: a request's whole plan from its messages, its prompt built once.

The plan holds what the steps after it need of the prompt: its tokens; where later prompts are
likely to leave it (checkpoints: after the persona, after a document the question carries, after
the earlier turns, and where each beginning the request asks to keep ends); the text that ends the
answer's turn; and the length of each kept beginning. Warm-ahead's draft prompts come from here
too, computed as the checkpoints are, so that a checkpoint sits where the next question's tokens
begin. Where a prompt left an earlier one is known only once the engine has compared them: the
planner names that place in words on demand (`place_of`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cache.keys import as_token_array, common_prefix_length
from chatapp.prompting.prompt import ChatMessage, PromptBuilder
from chatapp.vocabulary import Role


@dataclass(frozen=True)
class PromptPlan:
    """A prompt's tokens, where later prompts are likely to leave it (checkpoints), and its messages.

    For an engine whose server builds its own prompts (a chat API) `tokens` is empty: the
    messages go instead.
    """

    tokens: tuple[int, ...]
    checkpoints: tuple[int, ...] = ()
    messages: tuple[ChatMessage, ...] = ()
    turn_ends: tuple[str, ...] = ()  # text that ends the answer's turn (ChatTemplate.turn_ends)
    kept: tuple[int, ...] = ()  # per beginning asked to keep, its length in tokens (0: not one of the prompt)


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


class PromptPlanner:
    """Plans prompts with one builder (the engine's, or one derived from it offering tools)."""

    def __init__(self, builder: PromptBuilder) -> None:
        self.builder = builder

    def plan(
        self, messages: Sequence[ChatMessage], *, checkpoints: bool, keep_through: Sequence[int] = ()
    ) -> PromptPlan:
        """The plan of `messages` (the last one the new question). `keep_through`: the beginnings to keep, each
        as a count of messages. With `checkpoints` (a model whose state cannot be cut) the boundaries and the
        kept beginnings' ends are checkpoints, whether or not a cache keeps them: where its batches end must
        not depend on the cache (a run without one gives the answer of a restore)."""
        listed = list(messages)
        tokens = tuple(self.builder.build(listed))
        kept = tuple(self.kept_length(listed[:count], tokens) if count > 0 else 0 for count in keep_through)
        points = set(self.boundaries(listed)).union(length for length in kept if length) if checkpoints else set()
        return PromptPlan(tokens, tuple(sorted(points)), tuple(listed), self.builder.template.turn_ends, kept)

    def boundaries(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        """Token positions in the prompt of `messages` (the last one the new question) after the persona, after
        a document the question carries, and after the earlier turns: where later prompts part from it."""
        if not messages:
            return ()
        history, question = list(messages[:-1]), messages[-1]
        points: set[int] = set()
        if history and history[0].role is Role.SYSTEM:
            points.add(len(self.draft_tokens(history[:1], (), "")))
        if len(history) > 1:
            points.add(len(self.draft_tokens(history, (), "")))
        if question.role is Role.USER and len(question.parts) > 1:
            points.add(len(self.draft_tokens(history, question.parts[:-1], "")))
        return tuple(sorted(point for point in points if point > 0))

    def draft_tokens(self, messages: Sequence[ChatMessage], parts_before: tuple[str, ...], draft: str) -> list[int]:
        """What to warm while `draft` is typed after `messages` (`parts_before`: e.g. the document block)."""
        settled = settled_text(draft)
        tokens = self.builder.draft_tokens(list(messages), ChatMessage.of(Role.USER, *parts_before, settled))
        # The token at the boundary may merge with what is typed next: leave it to the real request.
        return tokens[:-1] if settled else tokens

    def kept_length(self, messages: Sequence[ChatMessage], prompt: Sequence[int]) -> int:
        """How much of `prompt` the beginning through `messages` is (a cache_control breakpoint's end): where the
        prompt of those messages alone stops agreeing with it."""
        tokens = self.builder.build(list(messages), add_generation_prompt=False)
        return common_prefix_length(as_token_array(tokens), as_token_array(prompt))

    def place_of(self, messages: Sequence[ChatMessage], tokens: Sequence[int], position: int) -> str:
        """Where token `position` of the prompt built from `messages` lies, in words: a line of the system
        prompt, the tools, a message ("" when unknown). The position alone (token 1,234) tells an agent's
        author little; the usual culprits are a date or a file tree in the system prompt and a tool list that
        changed or came in another order.

        The message is found by bisection over the conversation's prefixes (their token counts only
        grow), built without touching the builder's memo.
        """
        builder = self.builder

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
