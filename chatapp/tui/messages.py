"""Textual messages that carry engine events from the worker thread to the screen."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from chatapp.engine.events import GenerationResult


@dataclass
class AnswerText(Message):
    """New text of the answer being streamed."""

    text: str


@dataclass
class PrefillAdvanced(Message):
    """Prompt tokens evaluated so far."""

    done: int
    total: int


@dataclass
class AnswerFinished(Message):
    """The answer ended (completed, stopped, or cut by its limits)."""

    result: GenerationResult


@dataclass
class AnswerFailed(Message):
    """The answer could not be produced; `reason` is a one-line message for the user."""

    reason: str
