"""The chat screen's widgets, made before the screen composes them, so that its controllers get the widgets
they drive (and notify and run workers through them) rather than the screen; and where their workers' messages
go (the screen's queue, straight: a message that bubbled up from a widget would reach the screen a few
loop turns later, after the worker is seen to have ended)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from textual.message import Message
from textual.widgets import Label

from chatapp.tui.chat_log import ChatLog
from chatapp.tui.composer import Composer
from chatapp.tui.sidebar import Sidebar
from chatapp.tui.widgets import PrefillRow, StatusLine


@dataclass(frozen=True)
class ChatWidgets:
    sidebar: Sidebar  # the search box, the conversation list and the branch tree
    info: Label  # the line above the messages: persona, document, Q&A mode
    log: ChatLog  # the messages; also where the controllers' workers, timers and messages live
    prefill: PrefillRow
    composer: Composer
    status: StatusLine
    post: Callable[[Message], bool]  # to the screen, which hands each message to the controller it is for

    @classmethod
    def make(cls, post: Callable[[Message], bool]) -> ChatWidgets:
        return cls(
            post=post,
            sidebar=Sidebar(id="sidebar"),
            info=Label("", id="branch-info"),
            log=ChatLog(id="messages"),
            prefill=PrefillRow(id="prefill"),
            composer=Composer(id="composer", placeholder="Type a message · Enter sends · Ctrl+J new line · F1 help"),
            status=StatusLine(id="status"),
        )
