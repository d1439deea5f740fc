"""A conversation held in memory (`chatapp ask`, the bench): persona, document, and the turns so far.

Its prompt is built from `conversation_messages`, the same rules the TUI and the API use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chatapp.documents import Document
from chatapp.prompting.prompt import ChatMessage
from chatapp.services.messages import Turn, conversation_messages
from chatapp.vocabulary import Role


@dataclass
class Conversation:
    """An append-only list of turns with an optional persona and document."""

    system_prompt: str | None = None
    document: Document | None = None
    turns: list[Turn] = field(default_factory=list)

    def add_user(self, text: str) -> None:
        """Append a question (the first one carries the document, if any)."""
        self.turns.append(Turn(Role.USER, text))

    def add_answer(self, text: str, token_ids: tuple[int, ...] | None) -> None:
        """Append the model's answer with its exact token ids (None: not known, the text is tokenized)."""
        self.turns.append(Turn(Role.ASSISTANT, text, token_ids))

    def drop_last(self) -> None:
        self.turns.pop()

    def prompt_messages(self) -> list[ChatMessage]:
        """Everything the prompt is built from, persona first."""
        return conversation_messages(self.system_prompt, self.document, self.turns)
