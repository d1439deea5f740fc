"""The sidebar: search by title and text, rename, delete (asks first), and the age labels."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Input

from chatapp.tui.app import ChatApp
from chatapp.tui.dialogs import Confirm, TextPrompt
from chatapp.tui.sidebar import ConversationList, age, snippet
from tests.tui_support import make_app, running, send, wait_until


def test_ages_and_snippets_are_short() -> None:
    assert age(1000.0, now=1030.0) == "just now"
    assert age(0.0, now=5 * 60) == "5 min"
    assert age(0.0, now=3 * 3600) == "3 h"
    assert age(0.0, now=2 * 86400) == "2 d"
    assert snippet("a  b\nc") == "a b c"
    assert snippet("x" * 50, 10) == "x" * 9 + "…"


def listed_titles(app: ChatApp) -> list[str]:
    options = app.main_screen.query_one(ConversationList)
    return [str(options.get_option_at_index(i).prompt).rsplit("  ", 1)[0] for i in range(options.option_count)]


async def test_search_rename_and_delete(data_dir: Path) -> None:
    app = make_app(data_dir, max_tokens=4)
    async with running(app) as pilot:
        await send(pilot, app, "Tell me about owls.")
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: app.service.current.view().messages == ())
        await send(pilot, app, "Tell me about otters.")
        assert listed_titles(app) == ["Tell me about otters.", "Tell me about owls."], "newest first"

        await pilot.press("ctrl+f")
        search = app.main_screen.query_one("#search", Input)
        assert search.has_focus
        search.value = "OWLS"
        await wait_until(pilot, lambda: listed_titles(app) == ["Tell me about owls."])
        search.value = ""
        await wait_until(pilot, lambda: len(listed_titles(app)) == 2)

        app.main_screen.query_one("#composer").focus()
        await pilot.press("alt+r")
        await wait_until(pilot, lambda: isinstance(app.screen, TextPrompt))
        app.screen.query_one("#dialog-input", Input).value = "Otters"
        await pilot.press("enter")
        await wait_until(pilot, lambda: listed_titles(app)[0] == "Otters")
        assert app.service.current.view().conversation.title == "Otters"

        await pilot.press("alt+delete")
        await wait_until(pilot, lambda: isinstance(app.screen, Confirm))
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, Confirm))
        assert len(listed_titles(app)) == 2, "cancelled: nothing deleted"
        await pilot.press("alt+delete")
        await wait_until(pilot, lambda: isinstance(app.screen, Confirm))
        await pilot.click("#yes")
        await wait_until(pilot, lambda: listed_titles(app) == ["Tell me about owls."])
        assert app.service.current.view().conversation.title == "Tell me about owls.", "the next conversation opens"


async def test_a_narrow_terminal_gives_the_chat_the_width(data_dir: Path) -> None:
    app = make_app(data_dir)
    async with running(app, ready=False) as pilot:
        sidebar = app.main_screen.query_one("#sidebar")
        wide = sidebar.size.width
        await pilot.resize_terminal(80, 24)
        await wait_until(pilot, lambda: sidebar.size.width < wide)
        assert sidebar.display, "80 columns: narrower, still shown"
        chat = app.main_screen.query_one("#chat")
        assert chat.size.width >= 50, "the chat had 44 of 80 columns with the full sidebar"

        await pilot.resize_terminal(56, 24)
        await wait_until(pilot, lambda: not sidebar.display or sidebar.size.width == 0)
        assert sidebar.region.width == 0, "under 60 columns the sidebar starts hidden"
        await pilot.press("ctrl+b")
        await wait_until(pilot, lambda: sidebar.region.width > 0)
        assert sidebar.region.width < 56 / 2, "shown on request, still narrow"
