"""Words for figures: the line under each answer and the fields of the status line."""

from __future__ import annotations

from typing import Any

from chatapp.records import MessageRecord
from chatapp.vocabulary import MessageStatus, ReuseTier, Role

TIER_NAMES = {
    ReuseTier.DEVICE: "the live context",
    ReuseTier.RAM: "RAM",
    ReuseTier.DISK: "disk",
    ReuseTier.SERVER: "the server's cache",
}
STATUS_NOTES = {
    MessageStatus.STOPPED: "stopped",
    MessageStatus.CUT_OFF: "cut off at a limit",
    MessageStatus.PARTIAL: "cut off: the app closed while answering",
    MessageStatus.FAILED: "cut off: the engine failed while answering",
}


def reuse_text(stats: dict[str, Any]) -> str:
    """'reused 2,000 of 2,210 prompt tokens from disk'."""
    reused, prompt = int(stats.get("reused_tokens", 0)), int(stats.get("prompt_tokens", 0))
    tier = stats.get("reuse_tier", ReuseTier.NONE)
    if tier == ReuseTier.UNREPORTED:
        return f"{prompt:,} prompt tokens; the server does not say what it reused"
    text = f"reused {reused:,} of {prompt:,} prompt tokens"
    return text + (f" from {TIER_NAMES.get(tier, tier)}" if reused else "")


def answer_footnote(record: MessageRecord) -> str:
    """The line under an answer: cache result, first-token time, length, and how it ended."""
    if record.role is not Role.ASSISTANT:
        return ""
    parts = []
    stats = record.stats or {}
    if stats:
        parts.append(reuse_text(stats))
        parts.append(f"first token {float(stats.get('ttft_ms', 0)) / 1000:.2f} s")
        parts.append(f"{int(stats.get('generated_tokens', 0))} tokens")
        if stats.get("model"):
            parts.append(str(stats["model"]))
    note = STATUS_NOTES.get(record.status)
    if note:
        parts.append(note)
    return "; ".join(parts[:2]) + (" · " + " · ".join(parts[2:]) if len(parts) > 2 else "")


SHORT_TIER_NAMES = {
    ReuseTier.DEVICE: "context",
    ReuseTier.RAM: "RAM",
    ReuseTier.DISK: "disk",
    ReuseTier.SERVER: "server",
}


def speed_fields(stats: dict[str, Any]) -> tuple[str, ...]:
    """The last answer in the status line: first-token time, speed, and what the cache gave."""
    fields = [f"first token {float(stats.get('ttft_ms', 0)):,.0f} ms"]
    if stats.get("decode_tokens_per_s"):
        fields.append(f"{float(stats['decode_tokens_per_s']):.1f} tok/s")
    reused, prompt = int(stats.get("reused_tokens", 0)), int(stats.get("prompt_tokens", 0))
    tier = stats.get("reuse_tier", ReuseTier.NONE)
    if tier == ReuseTier.UNREPORTED:
        fields.append("cache not reported")
    else:
        fields.append(f"cache {reused:,}/{prompt:,}" + (f" from {SHORT_TIER_NAMES.get(tier, tier)}" if reused else ""))
    return tuple(fields)
