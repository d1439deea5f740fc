"""The chat screen driven by Textual's pilot, on the real bundled model."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Input, Markdown

from chatapp.services.startup import open_workspace
from chatapp.tui.app import ChatApp
from chatapp.tui.widgets import MessageView, StatusLine

SCREEN = (100, 30)


def make_app(data_dir: Path, **overrides: object) -> ChatApp:
    settings = {"temperature": 0.0, "context_cap": 1024, "sequences": 1, **overrides}
    return ChatApp(open_workspace(str(data_dir), settings))


async def wait_until(pilot, condition, timeout: float = 60.0) -> None:
    waited = 0.0
    while not condition():
        assert waited < timeout, "timed out waiting for the app"
        await pilot.pause(0.02)
        waited += 0.02


async def type_and_send(pilot, text: str) -> None:
    await pilot.click("#prompt")
    await pilot.press(*text)
    await pilot.press("enter")


def answers(app: ChatApp) -> list[MessageView]:
    return [view for view in app.chat_screen.query(MessageView) if view.role == "assistant"]


async def test_send_a_message_and_see_the_answer_stream_in(data_dir: Path, monkeypatch) -> None:
    appended: list[str] = []
    original_append = Markdown.append

    def recording_append(self: Markdown, fragment: str):
        appended.append(fragment)
        return original_append(self, fragment)

    monkeypatch.setattr(Markdown, "append", recording_append)
    app = make_app(data_dir, max_tokens=40)
    async with app.run_test(size=SCREEN) as pilot:
        screen = app.chat_screen
        await wait_until(pilot, lambda: screen.session is not None)
        await type_and_send(pilot, "Write a poem about rivers.")
        await wait_until(pilot, lambda: not screen.answering)
        assert screen.query_one("#prompt", Input).value == ""
        answer = answers(app)[0]
        final = answer.body.source
        assert len(appended) >= 3, "the answer should arrive piece by piece"
        assert "".join(appended) == final != ""
        footnote = str(answer.query_one(".footnote").render())
        assert "40 tokens" in footnote and "first token" in footnote
        status = str(screen.query_one(StatusLine).render())
        assert "SmolLM2-135M-Instruct" in status and "tok/s" in status and "first token" in status


async def test_escape_stops_a_running_answer_and_the_chat_goes_on(data_dir: Path) -> None:
    app = make_app(data_dir, max_tokens=400)
    async with app.run_test(size=SCREEN) as pilot:
        screen = app.chat_screen
        await wait_until(pilot, lambda: screen.session is not None)
        await type_and_send(pilot, "Tell me a very long story about a lighthouse keeper.")
        await wait_until(pilot, lambda: answers(app) != [] and len(answers(app)[0].body.source) > 10)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not screen.answering)
        footnote = str(answers(app)[0].query_one(".footnote").render())
        assert "stopped" in footnote
        generated = int(footnote.split(" tokens")[0])
        assert 0 < generated < 400
        # The next question reuses the conversation so far, live in the context.
        await type_and_send(pilot, "Thanks.")
        await wait_until(pilot, lambda: len(answers(app)) == 2 and not screen.answering)
        second = str(answers(app)[1].query_one(".footnote").render())
        assert "reused" in second and not second.startswith("reused 0 ")
        assert "reused 0 of" not in second


async def test_a_missing_model_is_a_notification_not_a_crash(data_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "gone.gguf"
    model.write_bytes(b"GGUF" + b"\x00" * 64)  # passes the header check, fails in llama.cpp
    app = make_app(data_dir, model=model)
    async with app.run_test(size=SCREEN) as pilot:
        await wait_until(pilot, lambda: bool(app._notifications))
        notification = list(app._notifications)[0]
        assert "could not load" in notification.message
        await type_and_send(pilot, "hello?")
        assert app.chat_screen.session is None
        assert "no model loaded" in str(app.chat_screen.query_one(StatusLine).render())


async def test_a_message_that_cannot_be_sent_goes_back_to_the_input(data_dir: Path) -> None:
    app = make_app(data_dir, context_cap=256)
    async with app.run_test(size=SCREEN) as pilot:
        screen = app.chat_screen
        await wait_until(pilot, lambda: screen.session is not None)
        long_message = "word " * 300
        screen.query_one("#prompt", Input).value = long_message
        await pilot.press("enter")
        await wait_until(pilot, lambda: not screen.answering and bool(app._notifications))
        assert "context holds" in list(app._notifications)[-1].message
        assert screen.query_one("#prompt", Input).value == long_message
        assert list(screen.query(MessageView)) == []
