"""What the main screen refuses or keeps safe: double starts, edits across switches, failed
sends, bad paths, a database error, actions during an answer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from textual.widgets import Input

from chatapp.engine.gate import Step
from chatapp.errors import StoreError
from chatapp.records import ConversationRecord
from chatapp.tui.composer import Composer
from chatapp.tui.dialogs import TextPrompt
from tests.tui_support import answers, engine_of, make_app, notifications, running, send, views, wait_idle, wait_until


async def test_two_quick_regenerates_start_one_answer(data_dir: Path) -> None:
    app = make_app(data_dir, max_tokens=4)
    async with running(app) as pilot:
        await send(pilot, app, "Name a bird.")
        app.workspace = app.service.slot.workspace = replace(
            app.workspace, settings=app.workspace.settings.model_copy(update={"max_tokens": 300})
        )
        with engine_of(app).holding(Step.TOKEN, after=1) as gate:  # the first regenerate runs until Esc
            # Two presses handled back to back (pilot.press would wait for the first answer to end).
            await app.main_screen.run_action("regenerate")
            await app.main_screen.run_action("regenerate")
            await wait_until(pilot, gate.reached_step.is_set)
            await pilot.press("escape")
            await wait_until(pilot, lambda: bool(answers(app)) and answers(app)[0].version_count >= 2)
            await wait_idle(pilot, app)
        question = app.service.current.view().messages[0].record
        assert len(app.service.conversations.children(question.id)) == 2, "one regenerate, not two"
        assert any("still running" in n for n in notifications(app))


async def test_an_edit_keeps_the_draft_and_is_dropped_when_the_conversation_changes(data_dir: Path) -> None:
    app = make_app(data_dir)
    async with running(app) as pilot:
        await send(pilot, app, "Name a tree.")
        composer = app.main_screen.query_one(Composer)
        composer.text = "half-typed draft"
        await pilot.press("ctrl+g")
        assert composer.text == "Name a tree."
        await pilot.press("escape")
        assert composer.text == "half-typed draft", "Esc gives the draft back"

        await pilot.press("ctrl+g")
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: app.service.current.view().messages == ())
        assert composer.text == "half-typed draft"
        assert app.main_screen.edit.editing is None
        await send(pilot, app, "Name a flower.")
        branch = app.service.current.view()
        assert [m.record.content for m in branch.messages if m.record.role == "user"] == ["Name a flower."]


async def test_a_failed_edit_is_still_an_edit_when_sent_again(data_dir: Path) -> None:
    app = make_app(data_dir, context_cap=256)
    async with running(app) as pilot:
        await send(pilot, app, "Name a river.")
        await send(pilot, app, "And another?")
        first_question = app.service.current.view().messages[0].record
        await pilot.press("alt+up", "alt+up", "alt+up")
        await pilot.press("ctrl+g")
        composer = app.main_screen.query_one(Composer)
        assert composer.text == "Name a river."
        composer.text = "word " * 300
        await pilot.press("enter")
        await wait_until(pilot, lambda: any("context holds" in n for n in notifications(app)))
        await wait_idle(pilot, app)
        assert app.main_screen.edit.editing == first_question.id
        composer.text = "Name a lake."
        await pilot.press("enter")
        await wait_until(pilot, lambda: views(app) and views(app)[0].version_count == 2)
        await wait_idle(pilot, app)
        edited = app.service.current.view().messages[0].record
        assert edited.content == "Name a lake."
        assert edited.parent_id == first_question.parent_id


async def test_actions_that_change_the_branch_wait_for_the_answer(data_dir: Path) -> None:
    app = make_app(data_dir, max_tokens=200)
    async with running(app) as pilot:
        app.main_screen.query_one(Composer).text = "Tell me a long story about a lighthouse."
        with engine_of(app).holding(Step.TOKEN, after=1) as gate:  # the answer runs until Esc
            await pilot.press("enter")
            await wait_until(pilot, gate.reached_step.is_set)
            await pilot.press("ctrl+t")
            assert not app.service.current.view().conversation.qa_mode
            assert any("still running" in n for n in notifications(app))
            await pilot.press("escape")
            await wait_idle(pilot, app)
        assert answers(app)
        assert "stopped" in str(answers(app)[0].query_one(".footnote").render())


async def test_a_path_that_cannot_be_a_path_is_a_notification(data_dir: Path) -> None:
    app = make_app(data_dir)
    async with running(app) as pilot:
        await pilot.press("alt+x")
        await wait_until(pilot, lambda: isinstance(app.screen, TextPrompt))
        app.screen.query_one("#dialog-input", Input).value = "~no-such-user-here/x.md"
        await pilot.press("enter")
        await wait_until(
            pilot, lambda: any("cannot use the path" in n or "does not exist" in n for n in notifications(app))
        )
        assert app.is_running


async def test_a_database_error_is_a_notification(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = make_app(data_dir)
    async with running(app) as pilot:

        def locked(query: str = "") -> list[ConversationRecord]:
            raise StoreError("the conversations database failed (database is locked); close the other program")

        monkeypatch.setattr(app.service.current, "list_conversations", locked)
        await pilot.press("ctrl+f")
        await pilot.press("x")
        await wait_until(pilot, lambda: any("database is locked" in n for n in notifications(app)))
        assert app.is_running
