"""The main screen driven by Textual's pilot on the real bundled model: send, stream, stop,
regenerate, move between sibling answers, edit into a branch, the tree, export, restart."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from textual.widgets import Input
from textual.widgets.markdown import MarkdownStream
from textual.widgets.tree import TreeNode

from chatapp.engine.gate import Step
from chatapp.services.export import export_view
from chatapp.tui.chat_log import ChatLog
from chatapp.tui.composer import Composer
from chatapp.tui.dialogs import TextPrompt
from chatapp.tui.sidebar import BranchTree, ConversationList
from chatapp.tui.widgets import StatusLine, last_code_block
from tests.tui_support import (
    answers,
    engine_of,
    footnote,
    make_app,
    notifications,
    running,
    send,
    views,
    wait_idle,
    wait_ready,
    wait_until,
)


async def test_an_answer_streams_in_and_is_saved(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    appended: list[str] = []  # what the screen streamed into the answer, piece by piece
    original_write = MarkdownStream.write

    async def recording_write(self: MarkdownStream, fragment: str) -> None:
        appended.append(fragment)
        await original_write(self, fragment)

    monkeypatch.setattr(MarkdownStream, "write", recording_write)
    app = make_app(data_dir, max_tokens=30)
    async with running(app) as pilot:
        await send(pilot, app, "Write a poem about rivers.")
        assert app.main_screen.query_one(Composer).text == ""
        answer = answers(app)[0]
        assert len(appended) >= 3, "the answer should arrive piece by piece"
        assert "".join(appended) == answer.text != ""
        note = footnote(answer)
        counted = re.search(r"(\d+) tokens", note)  # at most max_tokens: where it ends differs between CPUs
        assert counted is not None
        assert 0 < int(counted.group(1)) <= 30
        assert "first token" in note
        assert "prompt tokens" in note
        status = str(app.main_screen.query_one(StatusLine).render())
        assert "SmolLM2-135M-Instruct" in status
        assert "tok/s" in status
        assert "first token" in status
        saved = app.service.current.view()
        assert [m.record.role for m in saved.messages] == ["user", "assistant"]
        assert saved.messages[1].record.content == answer.text
        assert saved.conversation.title == "Write a poem about rivers."


async def test_stop_regenerate_and_move_between_sibling_answers(data_dir: Path) -> None:
    app = make_app(data_dir, max_tokens=300)
    async with running(app) as pilot:
        composer = app.main_screen.query_one(Composer)
        composer.text = "Tell me a very long story about a lighthouse keeper."
        with engine_of(app).holding(Step.TOKEN, after=10) as gate:  # ten tokens said, then held until Esc
            await pilot.press("enter")
            await wait_until(pilot, gate.reached_step.is_set)
            await wait_until(pilot, lambda: answers(app) != [] and len(answers(app)[0].text) > 10)
            await pilot.press("escape")
            await wait_idle(pilot, app)
        stopped = answers(app)[0]
        assert "stopped" in footnote(stopped)
        stopped_text = stopped.text
        assert app.service.current.view().messages[-1].record.status == "stopped"

        app.workspace = app.service.slot.workspace = replace(
            app.workspace, settings=app.workspace.settings.model_copy(update={"max_tokens": 8})
        )
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: len(answers(app)) == 1 and answers(app)[0].version_count == 2)
        await wait_idle(pilot, app)
        assert len(views(app)) == 2, "a regenerated answer replaces the old one in the view"
        regenerated = answers(app)[0]
        assert (regenerated.position, regenerated.version_count) == (2, 2)
        regenerated_text = regenerated.text
        assert regenerated_text != stopped_text
        assert regenerated_text

        await pilot.press("alt+left")
        await wait_until(pilot, lambda: answers(app)[0].position == 1)
        assert answers(app)[0].text == stopped_text
        await pilot.press("alt+right")
        await wait_until(pilot, lambda: answers(app)[0].position == 2)
        assert answers(app)[0].text == regenerated_text


async def test_editing_a_question_makes_a_branch_and_the_tree_switches_back(data_dir: Path) -> None:
    app = make_app(data_dir)
    async with running(app) as pilot:
        await send(pilot, app, "Name a fruit.")
        first_question = views(app)[0].message_id
        await pilot.press("ctrl+g")
        composer = app.main_screen.query_one(Composer)
        assert composer.text == "Name a fruit."
        composer.text = "Name a vegetable."
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(views(app)) == 2 and views(app)[0].version_count == 2)
        await wait_idle(pilot, app)
        question = views(app)[0]
        assert question.text == "Name a vegetable."
        assert (question.position, question.version_count) == (2, 2)
        assert len(views(app)) == 2

        tree = app.main_screen.query_one(BranchTree)
        node = next(n for n in _nodes(tree.root) if n.data == first_question)
        tree.select_node(node)
        await wait_until(pilot, lambda: bool(views(app)) and views(app)[0].message_id == first_question)
        assert views(app)[0].text == "Name a fruit."
        assert views(app)[0].position == 1
        assert len(views(app)) == 2, "the old branch comes back with its answer"


async def test_export_and_restart_find_everything_again(data_dir: Path, tmp_path: Path) -> None:
    app = make_app(data_dir)
    async with running(app) as pilot:
        await send(pilot, app, "What is a lighthouse?")
        await send(pilot, app, "Who works there?")
        expected = [(view.role, view.text) for view in views(app)]
        await pilot.press("alt+x")
        await wait_until(pilot, lambda: isinstance(app.screen, TextPrompt))
        target = tmp_path / "branch.json"
        app.screen.query_one("#dialog-input", Input).value = str(target)
        await pilot.press("enter")
        await wait_until(pilot, lambda: target.exists())
        exported = json.loads(target.read_text())
        assert [(m["role"], m["content"]) for m in exported["messages"]] == expected
        markdown = tmp_path / "branch.md"
        export_view(app.service.current.view(), markdown)
        assert "Who works there?" in markdown.read_text()
        title = app.service.current.view().conversation.title

    again = make_app(data_dir)
    async with running(again, ready=False) as pilot:
        await wait_until(pilot, lambda: len(views(again)) == 4)
        assert [(view.role, view.text) for view in views(again)] == expected
        listed = again.main_screen.query_one(ConversationList)
        assert title in str(listed.get_option_at_index(0).prompt)
        await wait_ready(pilot, again)
        await send(pilot, again, "And at night?")
        stats = again.service.current.view().messages[-1].record.stats
        assert stats is not None
        assert stats["prompt_tokens"] - stats["reused_tokens"] < 16, "after a restart the KV comes back from disk"


async def test_a_message_that_cannot_be_sent_goes_back_to_the_input(data_dir: Path) -> None:
    app = make_app(data_dir, context_cap=256)
    async with running(app) as pilot:
        long_message = "word " * 300
        composer = app.main_screen.query_one(Composer)
        composer.text = long_message
        await pilot.press("enter")
        await wait_until(pilot, lambda: any("context holds" in n for n in notifications(app)))
        await wait_idle(pilot, app)
        assert composer.text == long_message
        assert views(app) == []
        assert app.service.current.view().messages == ()


async def test_a_model_that_cannot_load_is_a_notification_not_a_crash(data_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "broken.gguf"
    model.write_bytes(b"GGUF" + b"\x00" * 64)  # passes the header check, fails in llama.cpp
    app = make_app(data_dir, model=model)
    async with running(app, ready=False) as pilot:
        await wait_until(pilot, lambda: any("could not load" in n for n in notifications(app)))
        app.main_screen.query_one(Composer).text = "hello?"
        await pilot.press("enter")
        assert not app.service.slot.ready
        assert "no model loaded" in str(app.main_screen.query_one(StatusLine).render())
        assert app.main_screen.query_one(ChatLog).views == []


def _nodes(node: TreeNode[int]) -> Iterator[TreeNode[int]]:
    yield node
    for child in node.children:
        yield from _nodes(child)


async def test_copy_a_message_and_its_code_block(data_dir: Path) -> None:
    app = make_app(data_dir, max_tokens=60)
    async with running(app) as pilot:
        await send(pilot, app, "Write a Python function that adds two numbers, in a code block.")
        await pilot.press("alt+c")
        assert app.clipboard == answers(app)[0].text != ""
        await pilot.press("alt+up")
        await pilot.press("alt+c")
        assert app.clipboard == "Write a Python function that adds two numbers, in a code block."
        assert "selected" in views(app)[0].classes
        await pilot.press("alt+down")
        await pilot.press("alt+k")
        if "```" in answers(app)[0].text:
            assert app.clipboard
            assert app.clipboard in answers(app)[0].text
            assert "```" not in app.clipboard
        else:
            assert any("no code block" in n for n in notifications(app))


def test_the_last_code_block_is_found_even_when_cut() -> None:
    assert last_code_block("a\n```py\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2"
    assert last_code_block("```python\ndef f():\n    return 1") == "def f():\n    return 1"
    assert last_code_block("no code here") is None
