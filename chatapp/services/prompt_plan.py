"""An engine's prompt plan (the planner's, chatapp/prompting/planner.py) and the one check that it fits, with
the one refusal of a prompt that does not.

Every surface goes through these by way of answer_start.AnswerStart, the one door an answer
starts through, so a prompt is built and checked one way, and a prompt that does not fit is
refused with one wording that carries both numbers (the caller adds what it is about and the
fix in its own terms: a key in the TUI, a flag in the CLI, a field for the API).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chatapp.engine.contract import EngineClient
from chatapp.errors import ChatappError, ContextOverflowError, DocumentError
from chatapp.prompting.planner import PromptPlan, PromptPlanner
from chatapp.prompting.prompt import ChatMessage, PromptBuilder


@dataclass(frozen=True)
class TooLongWording:
    """How a caller names what did not fit, and the fix it offers (in its own terms)."""

    subject: str  # "this branch", "document notes.md with the question", ...
    fix: str  # "start a new conversation (Ctrl+N) or raise context_cap (F5)", ...
    about_document: bool = False  # the document is what makes it too long: a DocumentError


class PromptTooLongError(ContextOverflowError):
    """A prompt that does not fit a conversation's context, worded by `prompt_too_long`."""


class DocumentTooLongError(PromptTooLongError, DocumentError):
    """A prompt too long because of its document."""


def prompt_too_long(prompt_tokens: int, context_tokens: int, wording: TooLongWording) -> PromptTooLongError:
    """The one message for a prompt that does not fit: what, both numbers, and the fix."""
    kind = DocumentTooLongError if wording.about_document else PromptTooLongError
    return kind(
        f"{wording.subject} is {prompt_tokens:,} tokens but a conversation's context holds {context_tokens:,}; "
        f"{wording.fix}",
        prompt_tokens=prompt_tokens,
        context_tokens=context_tokens,
    )


def plan_for(
    engine: EngineClient,
    messages: Sequence[ChatMessage],
    builder: PromptBuilder | None = None,
    keep_through: Sequence[int] = (),
) -> PromptPlan:
    """The plan for `engine`: checkpoints only where it keeps them; messages alone where its server builds prompts.

    `builder` is the engine's own or one derived from it (offering tools); `keep_through`: the beginnings a
    request asks to keep, as counts of messages (`PromptPlanner.plan`).
    """
    builder = builder or engine.prompt_builder
    if builder is None:
        return PromptPlan((), (), tuple(messages))
    return PromptPlanner(builder).plan(messages, checkpoints=engine.takes_checkpoints, keep_through=keep_through)


def builder_of(engine: EngineClient) -> PromptBuilder:
    """The engine's prompt builder; ChatappError where its server builds the prompts (a chat API)."""
    builder = engine.prompt_builder
    if builder is None:
        raise ChatappError(
            f"{engine.info.description}: prompts are built by the server, so this needs a server that "
            "shares its tokenizer (llama-server or chatapp serve)"
        )
    return builder


def check_fits(engine: EngineClient, tokens: int, wording: TooLongWording) -> None:
    """PromptTooLongError when `tokens` leave no room for an answer in one conversation's context."""
    limit = engine.info.n_ctx_per_sequence
    if limit and tokens >= limit:
        raise prompt_too_long(tokens, limit, wording)
