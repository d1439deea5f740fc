"""Personas: bundled ones listed, create one, use it (a new branch from the root), import/export."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Input, OptionList, TextArea

from chatapp.tui.persona_screen import PersonaScreen
from tests.tui_support import make_app, notifications, running, send, views, wait_until


async def test_create_a_persona_and_use_it_in_a_new_branch(data_dir: Path) -> None:
    app = make_app(data_dir)
    async with running(app) as pilot:
        await send(pilot, app, "Hello there.")
        await pilot.press("f2")
        await wait_until(pilot, lambda: isinstance(app.screen, PersonaScreen))
        screen = app.screen
        listed = [
            str(screen.query_one(OptionList).get_option_at_index(i).prompt)
            for i in range(screen.query_one(OptionList).option_count)
        ]
        assert {"Concise assistant", "Code reviewer", "Document analyst", "Translator"} <= set(listed)

        await pilot.click("#new")
        screen.query_one("#persona-name", Input).value = "Pirate"
        screen.query_one("#persona-prompt", TextArea).text = "You are a pirate. Answer like one."
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: any(p.name == "Pirate" for p in app.service.personas.all()))
        await pilot.press("ctrl+u")
        await wait_until(pilot, lambda: not isinstance(app.screen, PersonaScreen))
        await wait_until(pilot, lambda: app.service.current.view().persona_name == "Pirate")

        branch = app.service.current.view()
        assert branch.root.content == "You are a pirate. Answer like one."
        assert branch.messages == (), "a new persona starts a new branch from the root"
        assert views(app) == [], "a new persona starts a new branch from the root"
        assert branch.root_count == 2
        assert "Persona: Pirate" in str(app.main_screen.query_one("#branch-info").render())
        await send(pilot, app, "Who are you?")
        assert app.service.current.view().messages[-1].record.role == "assistant"


async def test_import_and_export_a_persona_file(data_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "haiku.md"
    source.write_text("# Haiku poet\n\nAnswer every question as a haiku.\n", encoding="utf-8")
    app = make_app(data_dir)
    async with running(app, ready=False) as pilot:
        await pilot.press("f2")
        await wait_until(pilot, lambda: isinstance(app.screen, PersonaScreen))
        await pilot.click("#import")
        await wait_until(pilot, lambda: not isinstance(app.screen, PersonaScreen))
        app.screen.query_one("#dialog-input", Input).value = str(source)
        await pilot.press("enter")
        await wait_until(pilot, lambda: any(p.name == "Haiku poet" for p in app.service.personas.all()))
        screen = app.screen
        assert isinstance(screen, PersonaScreen)
        assert screen.editing is not None
        assert screen.editing.name == "Haiku poet"
        await pilot.click("#export")
        await wait_until(pilot, lambda: not isinstance(app.screen, PersonaScreen))
        app.screen.query_one("#dialog-input", Input).value = str(tmp_path / "out")
        (tmp_path / "out").mkdir()
        await pilot.press("enter")
        await wait_until(pilot, lambda: any((tmp_path / "out").iterdir()))
        exported = next((tmp_path / "out").iterdir()).read_text(encoding="utf-8")
        assert exported.startswith("# Haiku poet")
        assert "Answer every question as a haiku." in exported


async def test_a_persona_file_that_does_not_parse_is_a_notification(data_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "broken.md"
    source.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    app = make_app(data_dir)
    async with running(app, ready=False) as pilot:
        await pilot.press("f2")
        await wait_until(pilot, lambda: isinstance(app.screen, PersonaScreen))
        before = {p.name for p in app.service.personas.all()}
        await pilot.click("#import")
        await wait_until(pilot, lambda: not isinstance(app.screen, PersonaScreen))
        app.screen.query_one("#dialog-input", Input).value = str(source)
        await pilot.press("enter")
        await wait_until(pilot, lambda: any("looks binary" in n for n in notifications(app)))
        assert {p.name for p in app.service.personas.all()} == before
