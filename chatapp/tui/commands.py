"""Every user action in one table: its key, its binding id, and its words.

The main screen's bindings, the command palette and the help screen are all built from
this table, so a key shown in help is the key that works and every action is in the palette.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding, BindingType


@dataclass(frozen=True)
class Command:
    id: str
    key: str
    action: str
    title: str
    help: str
    footer: bool = False
    priority: bool = False


COMMANDS: tuple[Command, ...] = (
    Command("chat.stop", "escape", "stop", "Stop", "Stop the answer or the warm-up; cancel editing", footer=True),
    Command(
        "chat.new",
        "ctrl+n",
        "conversation('new')",
        "New conversation",
        "Start a conversation with the current persona",
        footer=True,
        priority=True,
    ),
    Command(
        "chat.regenerate",
        "ctrl+r",
        "regenerate",
        "Regenerate answer",
        "Answer the selected question again, as a sibling answer",
        priority=True,
    ),
    Command(
        "chat.edit",
        "ctrl+g",
        "edit_question",
        "Edit question",
        "Edit the selected question; Enter sends it as a new branch",
        priority=True,
    ),
    Command(
        "chat.select_previous",
        "alt+up",
        "select(-1)",
        "Select previous message",
        "Move the selection to the message above",
        priority=True,
    ),
    Command(
        "chat.select_next",
        "alt+down",
        "select(1)",
        "Select next message",
        "Move the selection to the message below",
        priority=True,
    ),
    Command(
        "chat.sibling_previous",
        "alt+left",
        "sibling(-1)",
        "Previous sibling",
        "Show the previous version of the selected message (2/3 → 1/3)",
        priority=True,
    ),
    Command(
        "chat.sibling_next",
        "alt+right",
        "sibling(1)",
        "Next sibling",
        "Show the next version of the selected message (1/3 → 2/3)",
        priority=True,
    ),
    Command(
        "chat.copy",
        "alt+c",
        "copy('message')",
        "Copy message",
        "Copy the selected message to the clipboard",
        priority=True,
    ),
    Command(
        "chat.copy_code",
        "alt+k",
        "copy('code')",
        "Copy code block",
        "Copy the last code block of the selected message",
        priority=True,
    ),
    Command(
        "chat.qa_mode",
        "ctrl+t",
        "conversation('qa')",
        "Q&A mode",
        "Ask each question as a fresh branch from the persona and document",
        footer=True,
        priority=True,
    ),
    Command(
        "chat.attach",
        "ctrl+o",
        "document('attach')",
        "Attach document",
        "Attach a .txt, .md or .pdf file; questions reuse its KV",
        footer=True,
        priority=True,
    ),
    Command(
        "chat.detach",
        "alt+o",
        "document('detach')",
        "Detach document",
        "Continue without the document, in a new branch",
        priority=True,
    ),
    Command(
        "chat.search",
        "ctrl+f",
        "show('search')",
        "Search conversations",
        "Filter conversations by title and text",
        priority=True,
    ),
    Command(
        "chat.sidebar",
        "ctrl+b",
        "toggle_sidebar",
        "Toggle sidebar",
        "Show or hide the conversations and the branch tree",
        priority=True,
    ),
    Command("chat.tree", "f3", "show('tree')", "Branch tree", "Jump to any branch of this conversation", priority=True),
    Command(
        "chat.composer",
        "f6",
        "show('composer')",
        "Message box",
        "Move the cursor back to the message box",
        priority=True,
    ),
    Command(
        "chat.rename",
        "alt+r",
        "conversation('rename')",
        "Rename conversation",
        "Give the open conversation a new title",
        priority=True,
    ),
    Command(
        "chat.export",
        "alt+x",
        "conversation('export')",
        "Export branch",
        "Save the open branch as Markdown or JSON",
        priority=True,
    ),
    Command(
        "chat.delete",
        "alt+delete",
        "conversation('delete')",
        "Delete conversation",
        "Delete the open conversation (asks first)",
        priority=True,
    ),
    Command(
        "app.personas",
        "f2",
        "app.personas",
        "Personas",
        "Create, edit, import, export and pick personas",
        footer=True,
        priority=True,
    ),
    Command(
        "app.cache",
        "f4",
        "app.cache",
        "Cache",
        "Cache tiers, hit rate, pinned prefixes, prune and clear",
        footer=True,
        priority=True,
    ),
    Command(
        "app.models",
        "f7",
        "app.models",
        "Models",
        "Switch to another model on this machine (Ollama's, LM Studio's, Hugging Face's...)",
        footer=True,
        priority=True,
    ),
    Command(
        "app.settings",
        "f5",
        "app.settings",
        "Settings",
        "Model, context, GPU layers, sampling and cache budgets",
        footer=True,
        priority=True,
    ),
    Command("app.help", "f1", "app.help", "Help", "This list of keys", footer=True, priority=True),
)

# Keys that belong to widgets, listed in help for completeness.
WIDGET_KEYS: tuple[tuple[str, str], ...] = (
    ("enter", "Send the message (in the message box)"),
    ("ctrl+j", "New line in the message box (also alt+enter, shift+enter where the terminal sends it)"),
    ("up", "In an empty message box: edit your last question"),
    ("ctrl+p", "Command palette: every action by name"),
    ("tab / shift+tab", "Move between the sidebar, messages and the message box"),
    ("delete", "In the conversation list: delete the highlighted conversation"),
    ("ctrl+q", "Quit"),
)


def bindings() -> list[BindingType]:
    return [
        Binding(c.key, c.action, c.title, show=c.footer, id=c.id, priority=c.priority, tooltip=c.help) for c in COMMANDS
    ]


def display_key(key: str) -> str:
    """How a key is written for people: ctrl+n → Ctrl+N."""
    return "+".join(part.capitalize() if len(part) > 1 else part.upper() for part in key.split("+"))
