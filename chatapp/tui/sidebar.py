"""The sidebar: conversations (newest first, searchable) and the open conversation's branch tree."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, Label, OptionList, Tree
from textual.widgets.option_list import Option
from textual.widgets.tree import TreeNode

from chatapp.records import ConversationRecord, MessageRecord
from chatapp.vocabulary import Role

SNIPPET = 34


def snippet(text: str, length: int = SNIPPET) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= length else flat[: length - 1] + "…"


def age(timestamp: float, now: float | None = None) -> str:
    """'just now', '5 min', '3 h', '2 d': enough to tell conversations apart."""
    seconds = max(0.0, (now or time.time()) - timestamp)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return "just now"


class ConversationList(OptionList):
    BINDINGS = [Binding("delete", "delete_highlighted", "Delete", id="conversations.delete")]

    @dataclass
    class DeleteRequested(Message):
        conversation_id: int

    def show(self, conversations: list[ConversationRecord], current: int | None) -> None:
        self.clear_options()
        for record in conversations:
            label = Text(snippet(record.title, 28))
            label.append(f"  {age(record.updated_at)}", style="dim")
            self.add_option(Option(label, id=str(record.id)))
        if current is not None and any(record.id == current for record in conversations):
            self.highlighted = self.get_option_index(str(current))

    def action_delete_highlighted(self) -> None:
        if self.highlighted is not None:
            option = self.get_option_at_index(self.highlighted)
            self.post_message(self.DeleteRequested(int(option.id or 0)))


class BranchTree(Tree[int]):
    """Every message of the conversation; the open branch is bold. Enter jumps to a branch."""

    def show(
        self, messages: list[MessageRecord], active_path: set[int], documents: dict[int, str] | None = None
    ) -> None:
        self.clear()
        self.root.expand()
        nodes: dict[int, TreeNode[int]] = {}
        for record in messages:
            parent = nodes.get(record.parent_id, self.root) if record.parent_id is not None else self.root
            label = Text(_label(record, documents or {}), style="bold" if record.id in active_path else "dim")
            node = parent.add(label, data=record.id, expand=True)
            nodes[record.id] = node
        parents = {record.parent_id for record in messages}
        for record in messages:
            if record.id not in parents:
                nodes[record.id].allow_expand = False


def _label(record: MessageRecord, documents: dict[int, str]) -> str:
    if record.role is Role.SYSTEM:
        persona = record.persona_name or ("custom persona" if record.content else "no persona")
        document = documents.get(record.document_id) if record.document_id is not None else None
        return "◆ " + persona + (f" + {document}" if document else "")
    prefix = "You: " if record.role is Role.USER else "AI: "
    return prefix + snippet(record.content or "(empty)", 28)


class Sidebar(Vertical):
    @dataclass
    class ConversationChosen(Message):
        conversation_id: int

    @dataclass
    class BranchChosen(Message):
        message_id: int

    @dataclass
    class SearchChanged(Message):
        query: str

    def __init__(self, *, id: str | None = None) -> None:  # Textual's name for it
        super().__init__(id=id)
        self.search = Input(placeholder="Search (Ctrl+F)", id="search")
        self.conversations = ConversationList(id="conversations")
        self.branch_tree = BranchTree("conversation", id="branches")
        self.branch_tree.show_root = False
        self.branch_tree.guide_depth = 2

    def compose(self) -> ComposeResult:
        yield self.search
        yield self.conversations
        yield Label("Branches (F3)", classes="sidebar-title")
        yield self.branch_tree

    @on(Input.Changed, "#search")
    def _search(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.SearchChanged(event.value))

    @on(OptionList.OptionSelected, "#conversations")
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.post_message(self.ConversationChosen(int(event.option.id or 0)))

    @on(Tree.NodeSelected, "#branches")
    def _branch(self, event: Tree.NodeSelected[int]) -> None:
        event.stop()
        if event.node.data is not None:
            self.post_message(self.BranchChosen(event.node.data))
