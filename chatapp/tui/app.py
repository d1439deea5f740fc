"""The Textual application: opens the database at once, loads the model off the UI thread,
and hosts the main screen and its dialogs."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from chatapp.errors import ChatappError
from chatapp.services.cache_view import CacheService
from chatapp.services.chat_service import ChatService
from chatapp.services.library import Library, open_library
from chatapp.services.model_choice import model_choices
from chatapp.services.startup import Workspace
from chatapp.settings import Settings
from chatapp.tui import commands
from chatapp.tui.cache_screen import CacheScreen
from chatapp.tui.help_screen import HelpScreen
from chatapp.tui.main_screen import MainScreen
from chatapp.tui.model_picker import ModelPicker
from chatapp.tui.persona_screen import PersonaScreen
from chatapp.tui.settings_screen import SettingsScreen

# Windows has no hang-up signal.
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGHUP", "SIGTERM") if hasattr(signal, name))


class ChatApp(App[None]):
    """chatapp's TUI."""

    TITLE = "chatapp"
    CSS_PATH = "chat.tcss"
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", id="app.quit", priority=True)]

    def __init__(self, workspace: Workspace, library: Library | None = None) -> None:
        super().__init__()
        self.workspace = workspace
        self.library = library or open_library(workspace)
        self.service = ChatService(workspace, self.library.conversations, self.library.personas, self.library.pins)
        self.cache_service = CacheService(self.service)
        self.main_screen = MainScreen(self.service)
        self._replaced_signals: dict[int, Any] = {}  # signal -> the handler it had before this app

    def on_mount(self) -> None:
        self.push_screen(self.main_screen)
        self._exit_on_hangup()
        self.load_engine()

    def _exit_on_hangup(self) -> None:
        """Close as Ctrl+Q does when the terminal goes away (its window closed, an SSH session dropped)
        or the process is asked to stop: by default Python dies at once on SIGHUP or SIGTERM, and the
        cache's queued disk writes and this session's counters were lost with it. Exit code 128 + the
        signal, as a shell reports a process it stopped. A hang-up already ignored (nohup) stays so."""
        loop = asyncio.get_running_loop()
        for number in _STOP_SIGNALS:
            previous = signal.getsignal(number)
            if number != signal.SIGTERM and previous == signal.SIG_IGN:
                continue
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # no signals in this loop
                loop.add_signal_handler(number, partial(self.exit, return_code=128 + number))
                self._replaced_signals[number] = previous

    def _restore_signals(self) -> None:
        """Put back the handlers there were before (last of all: a second signal while the cache
        writes must not kill the process)."""
        loop = asyncio.get_running_loop()
        for number, previous in self._replaced_signals.items():
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError, TypeError):
                loop.remove_signal_handler(number)
                if previous is not None:
                    signal.signal(number, previous)
        self._replaced_signals.clear()

    @work(thread=True, exclusive=True, group="engine")
    def load_engine(self) -> None:
        """Load the model in a worker thread; conversations can be browsed meanwhile."""
        try:
            self.service.load_model()
        except ChatappError as error:
            self.call_from_thread(self._engine_failed, str(error))
            return
        self.call_from_thread(self._engine_ready)

    def _engine_ready(self) -> None:
        if not self.service.slot.ready:  # the app is closing: the service closed the model again
            return
        for notice in self.service.startup_notices():
            self.notify(notice, title="Engine and cache", severity="warning", timeout=15)
        self.main_screen.engine_ready(self.service.slot.model_label())

    def _engine_failed(self, reason: str) -> None:
        self.notify(reason, title="Cannot load the model", severity="error", timeout=30)
        self.main_screen.engine_failed(reason)

    def on_unmount(self) -> None:
        try:
            self.main_screen.model_switch.stop()
            self.service.close()
            self.library.close()
        finally:
            self._restore_signals()

    # Screens.
    def action_personas(self) -> None:
        if isinstance(self.screen, PersonaScreen):
            return
        current = self.main_screen.shown.branch.persona_name if self.main_screen.shown.branch else None

        async def chosen(result: PersonaScreen.Choice | None) -> None:
            if result is not None:
                await self.main_screen.conversations.use_persona(result.persona)

        self.push_screen(PersonaScreen(self.service.personas, current), chosen)

    def action_cache(self) -> None:
        if not isinstance(self.screen, CacheScreen):
            self.push_screen(CacheScreen(self.cache_service))

    def action_models(self) -> None:
        if isinstance(self.screen, ModelPicker):
            return
        if self.workspace.remote is not None:
            self.notify(
                "The model runs on the backend server: choose it there, or clear the backend setting (F5).",
                severity="warning",
                timeout=10,
            )
            return
        try:
            choices = model_choices(self.service.workspace, self.service.slot.model_path())
        except ChatappError as error:
            self.notify(str(error), severity="error", timeout=10)
            return

        def chosen(path: Path | None) -> None:
            if path is not None:
                self.main_screen.model_switch.start(path)

        self.push_screen(ModelPicker(choices), chosen)

    def action_settings(self) -> None:
        if isinstance(self.screen, SettingsScreen):
            return
        try:
            screen = SettingsScreen(self.workspace)
        except ChatappError as error:  # the file was broken after start-up
            self.notify(str(error), severity="error", timeout=15)
            return
        self.push_screen(screen, self._settings_saved)

    def _settings_saved(self, settings: Settings | None) -> None:
        if settings is not None:
            try:
                self.workspace = self.workspace.reloaded()
            except ChatappError as error:
                self.notify(str(error), severity="error", timeout=10)
                return
            self.service.slot.workspace = self.workspace

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """Every action of the table in the command palette, with its key."""
        yield from super().get_system_commands(screen)
        for command in commands.COMMANDS:
            yield SystemCommand(
                f"{command.title} ({commands.display_key(command.key)})",
                command.help,
                lambda action=command.action: self.run_action(action, self.main_screen),
            )
