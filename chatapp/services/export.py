"""Exporting one branch of a conversation (root to leaf) as Markdown or JSON.

A branch, not the whole tree: that is the conversation as the user saw it and as the model
answered it. The document is named and sized, not copied, so an export stays readable and
does not leak a whole file the user only meant to ask about.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from chatapp.atomic_write import write_text_atomically
from chatapp.errors import ChatappError
from chatapp.records import (
    ConversationRecord,
    DocumentRecord,
    MessageRecord,
)
from chatapp.services.branches import BranchView
from chatapp.vocabulary import MessageStatus, Role

FORMAT = "chatapp.branch"
VERSION = 1
_HEADINGS = {Role.USER: "You", Role.ASSISTANT: "Assistant"}
_NOTES = {
    MessageStatus.STOPPED: "(answer stopped)",
    MessageStatus.CUT_OFF: "(answer cut off)",
    MessageStatus.PARTIAL: "(answer incomplete)",
    MessageStatus.FAILED: "(answer incomplete: the engine failed)",
}


def branch_to_markdown(
    conversation: ConversationRecord, path: list[MessageRecord], document: DocumentRecord | None
) -> str:
    """The branch as a Markdown page: title, persona, document, then the exchange."""
    root, messages = _split(path)
    parts = [f"# {conversation.title}"]
    if root is not None and (root.persona_name or root.content):
        parts.append(f"**Persona:** {root.persona_name or '(custom prompt)'}")
        if root.content:
            parts.append("\n".join(f"> {line}".rstrip() for line in root.content.splitlines()))
    if document is not None:
        parts.append(f"**Document:** {document.name} ({len(document.text):,} characters)")
    for message in messages:
        parts.append(f"## {_HEADINGS[message.role]}")
        parts.append(message.content.strip() or "*(empty)*")
        note = _NOTES.get(message.status) if message.role == Role.ASSISTANT else None
        if note:
            parts.append(f"*{note}*")
    return "\n\n".join(parts) + "\n"


def branch_to_json(
    conversation: ConversationRecord, path: list[MessageRecord], document: DocumentRecord | None
) -> dict[str, Any]:
    """The branch as a versioned JSON object (token ids left out: they only fit one model)."""
    root, messages = _split(path)
    persona = None
    if root is not None and (root.persona_name or root.content):
        persona = {"name": root.persona_name, "prompt": root.content}
    return {
        "format": FORMAT,
        "version": VERSION,
        "title": conversation.title,
        "exported_at": time.time(),
        "persona": persona,
        "document": (
            {"name": document.name, "source_path": document.source_path, "characters": len(document.text)}
            if document is not None
            else None
        ),
        "messages": [_message_json(message) for message in messages],
    }


def write_export(text_or_dict: str | dict[str, Any], path: Path) -> Path:
    """Write Markdown text or a JSON object to `path` atomically; ChatappError with the fix on failure."""
    path = Path(path).expanduser()
    if isinstance(text_or_dict, str):
        text = text_or_dict
    else:
        text = json.dumps(text_or_dict, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    return write_text_atomically(path, text, what="the export", error=ChatappError)


def _split(path: list[MessageRecord]) -> tuple[MessageRecord | None, list[MessageRecord]]:
    root = path[0] if path and path[0].role == Role.SYSTEM else None
    return root, [message for message in path if message.role in _HEADINGS]


def _message_json(message: MessageRecord) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "role": message.role,
        "content": message.content,
        "created_at": message.created_at,
        "status": message.status,
    }
    if message.stats is not None:
        entry["stats"] = _finite(message.stats)
    return entry


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity (a rate over zero seconds); write those as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def export_file_name(view: BranchView) -> str:
    """A file name for the branch's conversation: its title in lower-case words joined by dashes."""
    words = "".join(c.lower() if c.isalnum() else " " for c in view.conversation.title).split()
    return "-".join(words[:8]) or "conversation"


def export_view(view: BranchView, path: Path) -> Path:
    """Write the branch on screen to `path`: JSON for a .json file, Markdown otherwise."""
    records = [view.root, *(message.record for message in view.messages)]
    if path.suffix.lower() == ".json":
        return write_export(branch_to_json(view.conversation, records, view.document), path)
    return write_export(branch_to_markdown(view.conversation, records, view.document), path)
