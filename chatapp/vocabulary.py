"""The app's words for roles, message statuses, stop reasons and reuse tiers: one enum each.

Every layer uses these (the store saves their values, the engine reports them, the screens
show them), so they live in a module of their own that imports nothing of the app. They are
StrEnums: a member equals its saved string, so rows and JSON written before them still read.
"""

from __future__ import annotations

from enum import StrEnum

from cache.tiers import ReuseTier

__all__ = ["MessageStatus", "ReuseTier", "Role", "StopReason"]


class Role(StrEnum):
    """Who wrote a message; a conversation's roots (persona and document) are SYSTEM."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"  # what tools returned to an agent's calls (the API only)


class StopReason(StrEnum):
    """Why an answer ended: the one vocabulary every surface words in its own way."""

    END = "end"  # the model ended its answer
    STOP_STRING = "stop_string"  # a stop string the caller named appeared (it is not shown)
    LENGTH = "length"  # max_tokens reached
    CONTEXT = "context"  # the conversation's context is full
    CANCELLED = "cancelled"  # the caller cancelled
    PREFILLED = "prefilled"  # a prefill-only request computed its prompt (no answer asked)
    FAILED = "failed"  # the engine failed midway (a remote server dropped the stream): what came is kept


class MessageStatus(StrEnum):
    """How a saved answer ended."""

    COMPLETE = "complete"
    STOPPED = "stopped"  # the user stopped it
    CUT_OFF = "cut_off"  # it hit the token or context limit
    PARTIAL = "partial"  # saved while streaming and never finished (the app closed)
    FAILED = "failed"  # the engine failed midway (a remote server dropped the stream): what came is kept

    @classmethod
    def after(cls, reason: StopReason) -> MessageStatus:
        """The status of an answer that ended for `reason`."""
        if reason is StopReason.CANCELLED:
            return cls.STOPPED
        if reason is StopReason.FAILED:
            return cls.FAILED
        if reason in (StopReason.LENGTH, StopReason.CONTEXT):
            return cls.CUT_OFF
        return cls.COMPLETE
