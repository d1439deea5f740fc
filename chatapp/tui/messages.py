"""Textual messages that carry an answer's or a warm-up's events from worker threads to the screen."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from chatapp.services.streams import AnswerOutcome


class AnswerEvent(Message):
    """What the answer worker reports; the screen hands every one to its AnswerRunner."""


@dataclass
class AnswerText(AnswerEvent):
    """New text of the answer being streamed."""

    text: str


@dataclass
class PrefillAdvanced(AnswerEvent):
    """Prompt tokens of the answer evaluated so far."""

    done: int
    total: int


@dataclass
class WarmProgress(Message):
    """Tokens of a warm-up evaluated so far; done < 0 when it ended."""

    done: int
    total: int


@dataclass
class AnswerStarted(AnswerEvent):
    """The question was saved and its answer is being computed."""


@dataclass
class AnswerFinished(AnswerEvent):
    """The answer ended (completed, stopped, or cut by its limits)."""

    outcome: AnswerOutcome


@dataclass
class AnswerFailed(AnswerEvent):
    """The answer failed; `started` says whether the question was saved before it did.

    An empty reason: the user stopped it before it started (nothing to tell).
    """

    reason: str
    started: bool
