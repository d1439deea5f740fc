"""Answering from the chat screen: a question sent, edited or answered again, from Enter to its end.

The answer in flight is one `AnswerFlight`. A worker thread starts the service's job and
forwards its events as Textual messages (`AnswerEvent`), which the screen hands back here on
the UI thread, so the screen never blocks. An answer that never starts gives its question back
to the message box.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from textual.widgets import Markdown

from chatapp.errors import ChatappError
from chatapp.services.answers import AnswerJob
from chatapp.services.chat_service import ChatService
from chatapp.services.streams import AnswerText as TextEvent
from chatapp.services.streams import PromptProgress
from chatapp.tui.answer_flight import AnswerFlight, FlightState
from chatapp.tui.branch_display import BranchDisplay
from chatapp.tui.chat_widgets import ChatWidgets
from chatapp.tui.messages import (
    AnswerEvent,
    AnswerFailed,
    AnswerFinished,
    AnswerStarted,
    AnswerText,
    PrefillAdvanced,
)
from chatapp.tui.model_switch import ModelSwitch
from chatapp.tui.question_edit import QuestionEdit
from chatapp.tui.warm_ahead import WarmAhead
from chatapp.tui.widgets import PROGRESS_FROM_TOKENS
from chatapp.vocabulary import Role


@dataclass(frozen=True)
class AnswerSiblings:
    """The controllers an answer's start and end reach: the edit it sends, the branch it redraws, the warm-up
    it starts again, and a model switch waiting for it to end."""

    edit: QuestionEdit
    shown: BranchDisplay
    warm: WarmAhead
    model_switch: ModelSwitch


class AnswerRunner:
    """At most one answer in flight (`flight`), set before any await so a second Enter cannot start another."""

    def __init__(self, widgets: ChatWidgets, service: ChatService, siblings: AnswerSiblings) -> None:
        self._widgets = widgets
        self._service = service
        self._edit, self._shown, self._warm = siblings.edit, siblings.shown, siblings.warm
        self._model_switch = siblings.model_switch
        self.flight: AnswerFlight | None = None

    @property
    def streaming(self) -> bool:
        """Whether answer text is arriving (a warm-up's progress then stays hidden)."""
        return self.flight is not None and self.flight.state is FlightState.ANSWERING

    async def send(self, text: str) -> None:
        """Enter in the message box: ask `text` (or send the question being edited as a new branch)."""
        edited, set_aside = self._edit.take()
        flight = self.flight = AnswerFlight(views=[], draft=text, edited_id=edited, set_aside=set_aside)
        log = self._widgets.log
        if edited is not None:
            widget = next((w for w in log.views if w.message_id == edited), None)
            await log.cut_after(log.index_of(widget) - 1 if widget else len(log.views) - 1)
        elif self._shown.branch is not None and self._shown.branch.conversation.qa_mode:
            await log.cut_after(-1)
        elif log.views and log.views[-1].role is Role.USER:
            await log.cut_after(len(log.views) - 2)  # an unanswered question is replaced
        question = text.strip()
        flight.views.append(await log.add(Role.USER, question))
        if edited is not None:
            await self._start(flight, lambda: self._service.edit(edited, question))
        else:
            await self._start(flight, lambda: self._service.ask(question))

    async def regenerate(self) -> None:
        """Answer the selected question (or the selected answer's) again, as a sibling answer."""
        log = self._widgets.log
        selected = log.selected
        if selected is None or selected.message_id is None:
            self._widgets.log.notify("Nothing to answer again yet: ask a question first.", severity="warning")
            return
        message_id = selected.message_id
        flight = self.flight = AnswerFlight(views=[], draft="")  # before any await
        question_index = log.index_of(selected) - (1 if selected.role is Role.ASSISTANT else 0)
        await log.cut_after(question_index)
        await self._start(flight, lambda: self._service.regenerate(message_id))

    def stop(self) -> bool:
        """Esc: stop the answer in flight; False when there is none."""
        flight = self.flight
        if flight is None:
            return False
        if flight.state in (FlightState.STARTING, FlightState.READING):
            self._service.stop_warming()  # the answer may be waiting for a long warm-up: stop both
        flight.stop()
        self._widgets.status.state = "stopping…"
        return True

    async def _start(self, flight: AnswerFlight, start: Callable[[], AnswerJob]) -> None:
        answer = await self._widgets.log.add(Role.ASSISTANT)
        flight.views.append(answer)
        flight.stream = Markdown.get_stream(answer.body)
        if flight.state is not FlightState.STOPPING:
            self._widgets.status.state = "thinking…"
        self._widgets.log.run_worker(lambda: self._run(flight, start), thread=True, exclusive=True, group="answer")

    def _run(self, flight: AnswerFlight, start: Callable[[], AnswerJob]) -> None:
        """Worker thread: start the answer and forward its events to the screen."""
        post = self._widgets.post
        if flight.state is FlightState.STOPPING:
            post(AnswerFailed("", started=False))  # Esc came first: nothing is asked
            return
        try:
            job = start()
        except ChatappError as error:
            post(AnswerFailed(str(error), started=False))
            return
        except Exception as error:  # the engine failing must not take the screen down
            post(AnswerFailed(f"the model failed: {error}", started=False))
            return
        flight.started(job)
        post(AnswerStarted())
        display = self._service.slot.answer_display()  # a gpt-oss answer shows its reply, not its reasoning
        try:
            for event in job.events():
                if isinstance(event, TextEvent):
                    if event.text:
                        post(AnswerText(display.feed(event.text)))
                elif isinstance(event, PromptProgress):
                    post(PrefillAdvanced(event.done, event.total))
        except Exception as error:
            post(AnswerFailed(f"the answer failed: {error}", started=True))
            return
        post(AnswerFinished(job.outcome()))

    # On the UI thread: the worker's events, in order.
    async def handle(self, message: AnswerEvent) -> None:
        if isinstance(message, AnswerText):
            await self._text(message.text)
        elif isinstance(message, PrefillAdvanced):
            if message.total >= PROGRESS_FROM_TOKENS:
                self._widgets.prefill.show_progress("reading the prompt", message.done, message.total)
        elif isinstance(message, AnswerStarted):
            if self.flight is not None and self.flight.set_aside:
                self._widgets.composer.give_back(self.flight.set_aside)  # the draft the edit put aside
                self.flight.set_aside = ""
        elif isinstance(message, AnswerFinished):
            await self._finished(message)
        elif isinstance(message, AnswerFailed):
            await self._failed(message)

    async def _text(self, text: str) -> None:
        flight = self.flight
        if flight is None:
            return
        if flight.stream is not None:
            await flight.stream.write(text)
        flight.text_arrived()
        if flight.tokens == 1:
            self._widgets.prefill.hide()
        if flight.tokens % 8 == 1 and flight.state is not FlightState.STOPPING:
            self._widgets.status.state = f"answering: {flight.tokens} tokens"

    async def _finished(self, message: AnswerFinished) -> None:
        flight = await self._close_stream()
        outcome = message.outcome
        self._widgets.status.last_answer = outcome.figures
        if flight is not None and not outcome.text and flight.views and flight.views[-1].is_attached:
            await flight.views[-1].body.update("*(no answer: stopped)*")
        await self._shown.reload()
        self._over()
        self._warm.ahead(self._widgets.composer.text)
        if notice := self._service.slot.take_cache_notice():
            self._widgets.log.notify(notice, title="KV cache", severity="warning", timeout=15)

    async def _failed(self, message: AnswerFailed) -> None:
        flight = await self._close_stream()
        if flight is not None and not message.started:
            # Nothing was asked: take the message back off the screen and into the box.
            for view in flight.views:
                if view.is_attached:
                    await view.remove()
            if flight.edited_id is not None:
                self._edit.resume(flight.edited_id, flight.set_aside)  # still an edit when sent again
            self._widgets.composer.give_back(flight.draft)
        await self._shown.reload()
        if message.reason:
            self._widgets.log.notify(message.reason, severity="error", timeout=10)
        self._over()

    def _over(self) -> None:
        """The answer is over only now that the screen shows it as saved."""
        self._widgets.status.state = "ready"
        self.flight = None
        self._model_switch.answer_ended()

    async def _close_stream(self) -> AnswerFlight | None:
        """The answer ended: hide its progress and finish writing its text."""
        self._widgets.prefill.hide()
        flight = self.flight
        if flight is not None and flight.stream is not None:
            await flight.stream.stop()
            flight.stream = None
        return flight
