"""The Textual application: loads the engine off the UI thread and hosts the chat screen."""

from __future__ import annotations

from textual import work
from textual.app import App
from textual.binding import Binding

from chatapp.engine.engine import Engine
from chatapp.errors import ChatappError
from chatapp.services.chat import ChatSession
from chatapp.services.conversation import Conversation
from chatapp.services.startup import Workspace
from chatapp.tui.chat_screen import ChatScreen


class ChatApp(App[None]):
    """chatapp's TUI."""

    TITLE = "chatapp"
    CSS_PATH = "chat.tcss"
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", id="app.quit", priority=True)]

    def __init__(self, workspace: Workspace) -> None:
        super().__init__()
        self.workspace = workspace
        self.engine: Engine | None = None
        self.chat_screen = ChatScreen()

    def on_mount(self) -> None:
        self.push_screen(self.chat_screen)
        self.load_engine()

    @work(thread=True, exclusive=True, group="engine")
    def load_engine(self) -> None:
        """Load the model in a worker thread; the screen stays usable meanwhile."""
        try:
            engine = self.workspace.open_engine()
        except ChatappError as error:
            self.call_from_thread(self._engine_failed, str(error))
            return
        self.call_from_thread(self._engine_ready, engine)

    def _engine_ready(self, engine: Engine) -> None:
        self.engine = engine
        session = ChatSession(engine, Conversation(), self.workspace.sampling())
        label = engine.info.path.stem
        self.sub_title = label
        self.chat_screen.attach_session(session, label)

    def _engine_failed(self, reason: str) -> None:
        self.notify(reason, title="Cannot load the model", severity="error", timeout=30)
        self.chat_screen.show_status("no model loaded: " + reason)

    def on_unmount(self) -> None:
        if self.engine is not None:
            self.engine.close()
