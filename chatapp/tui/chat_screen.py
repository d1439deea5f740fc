"""The chat screen: messages, an input line and a status line.

It holds no model logic: it sends text to a `ChatSession` (app services) and shows the
events of the `Reply`. Model work runs in a worker thread; its events arrive here as
Textual messages, so the screen never blocks.
"""

from __future__ import annotations

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, Markdown
from textual.widgets.markdown import MarkdownStream

from chatapp.engine.events import STOP_CANCELLED, STOP_CONTEXT, STOP_LENGTH, GenerationResult, PrefillProgress, TokenText
from chatapp.errors import ChatappError
from chatapp.services.chat import ChatSession, Reply
from chatapp.tui.messages import AnswerFailed, AnswerFinished, AnswerText, PrefillAdvanced
from chatapp.tui.widgets import MessageView, PromptInput, StatusLine

TIER_NAMES = {"device": "the live context", "ram": "RAM", "disk": "disk"}
STOP_NOTES = {
    STOP_CANCELLED: "stopped",
    STOP_LENGTH: "cut at the answer length limit",
    STOP_CONTEXT: "cut: the conversation's context is full",
}


class ChatScreen(Screen[None]):
    """Type a message, Enter sends it, the answer streams in, Esc stops it."""

    BINDINGS = [
        Binding("escape", "stop_answer", "Stop answer", id="chat.stop"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.session: ChatSession | None = None
        self.model_label = "loading model…"
        self._busy = False
        self._stop_requested = False
        self._reply: Reply | None = None
        self._question: MessageView | None = None
        self._pending_text = ""
        self._streamed_tokens = 0
        self._answer: MessageView | None = None
        self._stream: MarkdownStream | None = None
        self._context_used = 0

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield VerticalScroll(id="messages")
        yield PromptInput(placeholder="Type a message; Enter sends, Esc stops the answer", id="prompt")
        yield StatusLine(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#messages", VerticalScroll).anchor()
        self.query_one("#prompt", Input).focus()
        self.show_status("loading model…")

    # Called by the app once the engine is up.
    def attach_session(self, session: ChatSession, model_label: str) -> None:
        self.session = session
        self.model_label = model_label
        self.show_status("ready")

    @property
    def answering(self) -> bool:
        return self._busy

    @on(Input.Submitted, "#prompt")
    async def send_message(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if self.session is None or self.answering:
            self._give_back(event.value)
            if self.session is None:
                self.notify("The model is still loading; try again in a moment.", severity="warning")
            else:
                self.notify("An answer is still running; press Esc to stop it first.", severity="warning")
            return
        self._busy, self._stop_requested, self._reply = True, False, None
        self._pending_text = event.value
        self._streamed_tokens = 0
        messages = self.query_one("#messages", VerticalScroll)
        self._question = MessageView("user", text)
        await messages.mount(self._question)
        self._answer = MessageView("assistant")
        await messages.mount(self._answer)
        self._stream = Markdown.get_stream(self._answer.body)
        self.show_status("thinking…")
        self.run_answer(self.session, text)

    @work(thread=True, exclusive=True, group="answer")
    def run_answer(self, session: ChatSession, text: str) -> None:
        """Worker thread: start the reply and forward its events to the screen."""
        try:
            reply = session.send(text)
            self._reply = reply
            if self._stop_requested:  # Esc came before the reply existed
                reply.cancel()
            for event in reply.events():
                if isinstance(event, TokenText):
                    if event.text:
                        self.post_message(AnswerText(event.text))
                elif isinstance(event, PrefillProgress):
                    self.post_message(PrefillAdvanced(event.done, event.total))
        except ChatappError as error:
            self.post_message(AnswerFailed(str(error)))
            return
        except Exception as error:  # an engine failure must not take the screen down
            self.post_message(AnswerFailed(f"the model failed: {error}"))
            return
        assert reply.result is not None
        self.post_message(AnswerFinished(reply.result))

    def action_stop_answer(self) -> None:
        if not self._busy:
            return
        self._stop_requested = True
        if self._reply is not None:
            self._reply.cancel()
        self.show_status("stopping…")

    async def on_answer_text(self, message: AnswerText) -> None:
        if self._stream is not None:
            await self._stream.write(message.text)
        self._streamed_tokens += 1
        if self._streamed_tokens % 8 == 1:
            self.show_status(f"answering: {self._streamed_tokens} tokens")

    def on_prefill_advanced(self, message: PrefillAdvanced) -> None:
        if message.total > 512:
            self.show_status(f"reading prompt {message.done:,}/{message.total:,} tokens")

    async def on_answer_finished(self, message: AnswerFinished) -> None:
        await self._end_stream()
        result = message.result
        self._context_used = result.stats.prompt_tokens + result.stats.generated_tokens
        if self._answer is not None:
            self._answer.set_footnote(_footnote(result))
            if not result.text and result.stop_reason == STOP_CANCELLED:
                await self._answer.body.update("*(no answer: stopped)*")
        self._answer = self._question = None
        self.show_status("ready", *_speed_fields(result))

    async def on_answer_failed(self, message: AnswerFailed) -> None:
        """Nothing was answered: take the message back off the screen and into the input line."""
        await self._end_stream()
        for view in (self._answer, self._question):
            if view is not None:
                await view.remove()
        self._answer = self._question = None
        self._give_back(self._pending_text)
        self.notify(message.reason, severity="error", timeout=8)
        self.show_status("ready")

    def _give_back(self, text: str) -> None:
        """Put an unsent message back in the input line, unless the user is typing another."""
        prompt = self.query_one("#prompt", Input)
        if not prompt.value:
            prompt.value = text

    async def _end_stream(self) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self._busy, self._reply = False, None

    def show_status(self, state: str, *extra: str) -> None:
        context = ""
        if self.session is not None:
            size = self.session.engine.info.n_ctx_per_sequence
            context = f"context {self._context_used:,}/{size:,}"
        self.query_one("#status", StatusLine).show(self.model_label, context, *extra, state)


def _speed_fields(result: GenerationResult) -> tuple[str, ...]:
    stats = result.stats
    fields = [f"first token {stats.ttft_ms:,.0f} ms"]
    if stats.decode_tokens_per_s:
        fields.append(f"{stats.decode_tokens_per_s:.1f} tok/s")
    return tuple(fields)


def _footnote(result: GenerationResult) -> str:
    stats = result.stats
    parts = [
        f"{stats.generated_tokens} tokens",
        f"first token {stats.ttft_ms / 1000:.2f} s",
        f"reused {stats.reused_tokens:,} of {stats.prompt_tokens:,} prompt tokens"
        + (f" from {TIER_NAMES.get(stats.reuse_tier, stats.reuse_tier)}" if stats.reused_tokens else ""),
    ]
    note = STOP_NOTES.get(result.stop_reason)
    if note:
        parts.append(note)
    return " · ".join(parts)
