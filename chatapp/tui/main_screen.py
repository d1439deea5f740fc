"""The main screen: sidebar, the open branch, the message box and the status line.

It holds no model or cache logic. It calls the `ChatService` (app services) and shows
what comes back. Answers and warm-ups run in worker threads; their events arrive here
as Textual messages, so the screen never blocks. The answer in flight is one
`AnswerFlight`; the status line redraws itself from reactive attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, Label, Markdown
from textual.worker import get_current_worker

from chatapp.errors import ChatappError
from chatapp.paths import user_path
from chatapp.records import PersonaRecord
from chatapp.services.answers import AnswerJob
from chatapp.services.branches import BranchView
from chatapp.services.chat_service import ChatService
from chatapp.services.document_files import start_folder
from chatapp.services.drafts import settled_text
from chatapp.services.export import export_file_name, export_view
from chatapp.services.model_choice import fit_problem
from chatapp.services.streams import AnswerText as TextEvent
from chatapp.services.streams import PromptProgress
from chatapp.tui import commands
from chatapp.tui.answer_flight import AnswerFlight, FlightState
from chatapp.tui.attempt import attempt
from chatapp.tui.chat_log import ChatLog
from chatapp.tui.composer import Composer
from chatapp.tui.dialogs import Confirm, TextPrompt
from chatapp.tui.document_attach import DocumentAttach
from chatapp.tui.document_picker import DocumentPicker
from chatapp.tui.messages import (
    AnswerFailed,
    AnswerFinished,
    AnswerStarted,
    AnswerText,
    PrefillAdvanced,
    WarmProgress,
)
from chatapp.tui.model_switch import ModelSwitch
from chatapp.tui.sidebar import BranchTree, ConversationList, Sidebar
from chatapp.tui.widgets import MessageView, PrefillRow, StatusLine, last_code_block
from chatapp.vocabulary import Role

PROGRESS_FROM_TOKENS = 256  # shorter prefills finish before a bar would help
T = TypeVar("T")


class MainScreen(Screen[None]):
    BINDINGS = commands.bindings()

    def __init__(self, service: ChatService) -> None:
        super().__init__()
        self.service = service
        self.branch: BranchView | None = None
        self.flight: AnswerFlight | None = None  # the answer being produced, from Enter to its end
        self._editing: int | None = None
        self._draft_before_edit = ""
        self._model_failed = False
        self._settled = ""
        self.model_switch = ModelSwitch(self, service, lambda: self.answering, self.engine_ready)
        self.documents = DocumentAttach(self, service, lambda: self.status, self._run_view_change, lambda: self.branch)

    @property
    def answering(self) -> bool:
        """Whether an answer is in flight (set before any await: a second Enter cannot start another)."""
        return self.flight is not None

    @property
    def reading_document(self) -> bool:
        """Whether a document is being read and attached (sending waits for it)."""
        return self.documents.reading

    @property
    def status(self) -> StatusLine:
        return self.query_one(StatusLine)

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Horizontal(id="main"):
            yield Sidebar(id="sidebar")
            with Vertical(id="chat"):
                yield Label("", id="branch-info")
                yield ChatLog(id="messages")
                yield PrefillRow(id="prefill")
                yield Composer(id="composer", placeholder="Type a message · Enter sends · Ctrl+J new line · F1 help")
                yield StatusLine(id="status")
        yield Footer()

    async def on_mount(self) -> None:
        self.query_one(ChatLog).anchor()
        self.query_one(PrefillRow).hide()
        self.query_one(Composer).focus()
        try:
            self.branch = self.service.current.open_latest_or_new()
        except ChatappError as error:
            self.notify(str(error), severity="error", timeout=15)
            return
        await self._show_branch()
        self.refresh_conversations()

    # Called by the app.
    def engine_ready(self, model_label: str) -> None:
        self.status.model = model_label
        self.status.context_size = self.service.slot.context_size()
        self.status.state = "ready"
        self._update_branch_info()
        self._show_answers_as_this_model_reads_them()
        self.warm_ahead("")
        self._follow_the_conversation_s_model()

    def _show_answers_as_this_model_reads_them(self) -> None:
        """Shown before the model loaded, a gpt-oss answer was its raw text: now its reply (see ChatService.view)."""
        if self.branch is None or self.flight is not None or not self.service.slot.hides_reasoning():
            return  # nothing shown raw (an answer in flight: its end refreshes the view)
        try:
            view = self.service.current.view()
        except ChatappError:
            return
        if any(message.shown != old.shown for message, old in zip(view.messages, self.branch.messages, strict=False)):
            self.branch = view
            self.call_later(self.query_one(ChatLog).refresh_versions, view)

    def switch_model(self, path: Path) -> None:
        """Load `path` while the model answering goes on, then answer with it (F7's choice)."""
        self.model_switch.start(path)

    def _follow_the_conversation_s_model(self) -> None:
        """A conversation answered by another model that is still here gets that model back."""
        try:
            remembered = self.service.remembered_model()
        except ChatappError:
            return
        if remembered is not None and not self.model_switch.loading:
            current = self.service.slot.model_label()
            if problem := fit_problem(remembered):
                self.notify(
                    f"This conversation was with {remembered.name}, which {problem}: staying with {current}.",
                    title="Model",
                    severity="warning",
                    timeout=10,
                )
                return
            self.model_switch.start(
                remembered, f"This conversation was with {remembered.name}: loading it (Esc stays with {current})."
            )

    def engine_failed(self, reason: str) -> None:
        self._model_failed = True
        self.status.model = "no model"
        self.status.state = "no model loaded: " + reason

    # Rendering.
    async def _show_branch(self) -> None:
        assert self.branch is not None
        await self.query_one(ChatLog).show_branch(self.branch)
        self._after_branch_change()

    def _after_branch_change(self) -> None:
        assert self.branch is not None
        self._update_branch_info()
        active = {m.record.id for m in self.branch.messages} | {self.branch.root.id}
        try:
            self.query_one(BranchTree).show(self.service.current.tree(), active, self.service.current.document_names())
        except ChatappError as error:
            self.notify(str(error), severity="error")
        figures = next((m.record.stats for m in reversed(self.branch.messages) if m.record.stats), None)
        used = int(figures.get("prompt_tokens", 0) + figures.get("generated_tokens", 0)) if figures else 0
        self.status.context_used = used
        self.status.persona = self.branch.persona_name or "no persona"
        self.sub_title = self.branch.conversation.title

    def _update_branch_info(self) -> None:
        if self.branch is None:
            return
        branch = self.branch
        fields = [f"Persona: {branch.persona_name or 'none'}"]
        document = branch.document
        if document is not None:
            tokens = attempt(self, lambda: self.service.document_tokens(document))
            size = self.service.slot.context_size()
            amount = f" ({tokens:,} of {size:,} tokens)" if tokens is not None and size else ""
            fields.append(f"Document: {document.name}{amount}")
        if branch.conversation.qa_mode:
            fields.append("Q&A mode: each question starts from the document")
        self.query_one("#branch-info", Label).update("  ·  ".join(fields))

    def refresh_conversations(self, query: str | None = None) -> None:
        search = self.query_one("#search", Input).value if query is None else query
        current = self.branch.conversation.id if self.branch else None
        conversations = attempt(self, lambda: self.service.current.list_conversations(search))
        if conversations is not None:
            self.query_one(ConversationList).show(conversations, current)

    # Sidebar.
    @on(Sidebar.SearchChanged)
    def _search(self, event: Sidebar.SearchChanged) -> None:
        self.refresh_conversations(event.query)

    @on(Sidebar.ConversationChosen)
    async def _open_conversation(self, event: Sidebar.ConversationChosen) -> None:
        if self._refuse_while_answering():
            return
        await self._run_view_change(lambda: self.service.current.open(event.conversation_id))
        self.query_one(Composer).focus()
        self._follow_the_conversation_s_model()

    @on(Sidebar.BranchChosen)
    async def _jump(self, event: Sidebar.BranchChosen) -> None:
        if self._refuse_while_answering():
            return
        await self._run_view_change(lambda: self.service.current.jump_to(event.message_id))

    @on(ConversationList.DeleteRequested)
    def _delete_from_list(self, event: ConversationList.DeleteRequested) -> None:
        self._confirm_delete(event.conversation_id)

    async def _run_view_change(self, change: Callable[[], BranchView]) -> None:
        try:
            self.branch = change()
        except ChatappError as error:
            self.notify(str(error), severity="error")
            return
        if self._editing is not None:
            self._cancel_edit()
        self.query_one(PrefillRow).hide()
        await self._show_branch()
        self.refresh_conversations()
        self.warm_ahead(self.query_one(Composer).text)

    def _refuse_while_answering(self) -> bool:
        if self.answering:
            self.notify("An answer is still running; press Esc to stop it first.", severity="warning")
        elif self.documents.reading:
            self.notify("A document is being read; wait a moment.", severity="warning")
        return self.answering or self.documents.reading

    # Sending, editing, regenerating.
    @on(Composer.Submitted)
    async def _submitted(self, event: Composer.Submitted) -> None:
        text = event.text.strip()
        if not text:
            return
        if not self._model_ready() or self._refuse_while_answering():
            self._give_back(event.text)
            return
        editing = self._editing
        self._editing = None
        flight = self.flight = AnswerFlight(views=[], draft=event.text, edited_id=editing)  # before any await
        if editing is not None:
            flight.set_aside, self._draft_before_edit = self._draft_before_edit, ""
        log = self.query_one(ChatLog)
        if editing is not None:
            widget = next((w for w in log.views if w.message_id == editing), None)
            await log.cut_after(log.index_of(widget) - 1 if widget else len(log.views) - 1)
        elif self.branch is not None and self.branch.conversation.qa_mode:
            await log.cut_after(-1)
        elif log.views and log.views[-1].role is Role.USER:
            await log.cut_after(len(log.views) - 2)  # an unanswered question is replaced
        flight.views.append(await log.add(Role.USER, text))
        if editing is not None:
            await self._start_answer(flight, lambda: self.service.edit(editing, text))
        else:
            await self._start_answer(flight, lambda: self.service.ask(text))

    async def action_regenerate(self) -> None:
        if self._refuse_while_answering() or not self._model_ready():
            return
        log = self.query_one(ChatLog)
        selected = log.selected
        if selected is None or selected.message_id is None:
            self.notify("Nothing to answer again yet: ask a question first.", severity="warning")
            return
        message_id = selected.message_id
        flight = self.flight = AnswerFlight(views=[], draft="")  # before any await
        question_index = log.index_of(selected) - (1 if selected.role is Role.ASSISTANT else 0)
        await log.cut_after(question_index)
        await self._start_answer(flight, lambda: self.service.regenerate(message_id))

    def action_edit_question(self) -> None:
        log = self.query_one(ChatLog)
        selected = log.selected
        if selected is not None and selected.role is Role.ASSISTANT:
            index = log.index_of(selected)
            selected = log.views[index - 1] if index > 0 else None
        if selected is None or selected.message_id is None:
            self.notify("No question to edit yet.", severity="warning")
            return
        self._begin_edit(selected)

    @on(Composer.EditLast)
    def _edit_last(self) -> None:
        questions = [w for w in self.query_one(ChatLog).views if w.role is Role.USER and w.message_id is not None]
        if questions:
            self._begin_edit(questions[-1])

    def _begin_edit(self, question: MessageView) -> None:
        if self._refuse_while_answering():
            return
        composer = self.query_one(Composer)
        if self._editing is None:
            self._draft_before_edit = composer.text  # put back when the edit is sent or cancelled
        composer.text = question.text
        composer.move_cursor(composer.document.end)
        composer.focus()
        self._editing = question.message_id
        self.status.state = "editing a question: Enter sends it as a new branch, Esc cancels"

    def _cancel_edit(self) -> None:
        self._editing = None
        composer = self.query_one(Composer)
        composer.text = self._draft_before_edit
        self._draft_before_edit = ""
        if self.service.slot.ready:
            self.status.state = "ready"

    async def _start_answer(self, flight: AnswerFlight, start: Callable[[], AnswerJob]) -> None:
        answer = await self.query_one(ChatLog).add(Role.ASSISTANT)
        flight.views.append(answer)
        flight.stream = Markdown.get_stream(answer.body)
        if flight.state is not FlightState.STOPPING:
            self.status.state = "thinking…"
        self.run_answer(flight, start)

    @work(thread=True, exclusive=True, group="answer")
    def run_answer(self, flight: AnswerFlight, start: Callable[[], AnswerJob]) -> None:
        """Worker thread: start the answer and forward its events to the screen."""
        if flight.state is FlightState.STOPPING:
            self.post_message(AnswerFailed("", started=False))  # Esc came first: nothing is asked
            return
        try:
            job = start()
        except ChatappError as error:
            self.post_message(AnswerFailed(str(error), started=False))
            return
        except Exception as error:  # the engine failing must not take the screen down
            self.post_message(AnswerFailed(f"the model failed: {error}", started=False))
            return
        flight.started(job)
        self.post_message(AnswerStarted())
        display = self.service.slot.answer_display()  # a gpt-oss answer shows its reply, not its reasoning
        try:
            for event in job.events():
                if isinstance(event, TextEvent):
                    if event.text:
                        self.post_message(AnswerText(display.feed(event.text)))
                elif isinstance(event, PromptProgress):
                    self.post_message(PrefillAdvanced(event.done, event.total))
        except Exception as error:
            self.post_message(AnswerFailed(f"the answer failed: {error}", started=True))
            return
        self.post_message(AnswerFinished(job.outcome()))

    def on_answer_started(self, message: AnswerStarted) -> None:
        flight = self.flight
        if flight is not None and flight.set_aside:
            self._give_back(flight.set_aside)  # the draft the edit had put aside
            flight.set_aside = ""

    async def on_answer_text(self, message: AnswerText) -> None:
        flight = self.flight
        if flight is None:
            return
        if flight.stream is not None:
            await flight.stream.write(message.text)
        flight.text_arrived()
        if flight.tokens == 1:
            self.query_one(PrefillRow).hide()
        if flight.tokens % 8 == 1 and flight.state is not FlightState.STOPPING:
            self.status.state = f"answering: {flight.tokens} tokens"

    def on_prefill_advanced(self, message: PrefillAdvanced) -> None:
        if message.total >= PROGRESS_FROM_TOKENS:
            self.query_one(PrefillRow).show_progress("reading the prompt", message.done, message.total)

    async def on_answer_finished(self, message: AnswerFinished) -> None:
        flight = await self._close_stream()
        outcome = message.outcome
        self.status.last_answer = outcome.figures
        if flight is not None and not outcome.text and flight.views and flight.views[-1].is_attached:
            await flight.views[-1].body.update("*(no answer: stopped)*")
        await self._reload_branch()
        self.status.state = "ready"
        self.flight = None  # the answer is over only now that the screen shows it as saved
        self.model_switch.answer_ended()
        self.warm_ahead(self.query_one(Composer).text)
        if notice := self.service.slot.take_cache_notice():
            self.notify(notice, title="KV cache", severity="warning", timeout=15)

    async def on_answer_failed(self, message: AnswerFailed) -> None:
        flight = await self._close_stream()
        if flight is not None and not message.started:
            # Nothing was asked: take the message back off the screen and into the box.
            for view in flight.views:
                if view.is_attached:
                    await view.remove()
            if flight.edited_id is not None:
                self._editing = flight.edited_id  # still an edit when sent again
                self._draft_before_edit = flight.set_aside
            self._give_back(flight.draft)
        await self._reload_branch()
        if message.reason:
            self.notify(message.reason, severity="error", timeout=10)
        self.status.state = "ready"
        self.flight = None
        self.model_switch.answer_ended()

    async def _close_stream(self) -> AnswerFlight | None:
        """The answer ended: hide its progress and finish writing its text."""
        self.query_one(PrefillRow).hide()
        flight = self.flight
        if flight is not None and flight.stream is not None:
            await flight.stream.stop()
            flight.stream = None
        return flight

    async def _reload_branch(self) -> None:
        try:
            self.branch = self.service.current.view()
        except ChatappError as error:
            self.notify(str(error), severity="error")
            return
        if not await self.query_one(ChatLog).refresh_versions(self.branch):
            await self._show_branch()
        else:
            self._after_branch_change()
        self.refresh_conversations()

    def _give_back(self, text: str) -> None:
        """Put text back in the box; what the user typed meanwhile is kept after it."""
        if not text:
            return
        composer = self.query_one(Composer)
        if composer.text.strip() and composer.text != text:
            composer.text = text + "\n\n" + composer.text
            self.notify("Your unsent message is back in the box, above what you typed since.")
        else:
            composer.text = text

    def _model_ready(self) -> bool:
        if self._model_failed:
            self.notify("No model is loaded: fix the model setting (F5) and restart chatapp.", severity="error")
        elif not self.service.slot.ready:
            self.notify("The model is still loading; try again in a moment.", severity="warning")
        return self.service.slot.ready

    # Stop.
    def action_stop(self) -> None:
        flight = self.flight
        if flight is not None:
            if flight.state in (FlightState.STARTING, FlightState.READING):
                self.service.stop_warming()  # the answer may be waiting for a long warm-up: stop both
            flight.stop()
            self.status.state = "stopping…"
        elif self._editing is not None:
            self._cancel_edit()
        elif not self.model_switch.cancel():
            self.service.stop_warming()
            self.query_one(PrefillRow).hide()

    # Warm-ahead and type-ahead.
    @on(Composer.Changed)
    def _typing(self, event: Composer.Changed) -> None:
        settled = settled_text(event.text_area.text)
        if settled != self._settled:
            self._settled = settled
            self.warm_ahead(event.text_area.text)

    def warm_ahead(self, draft: str) -> None:
        if self.service.slot.ready and not self.answering and self._editing is None:
            self._settled = settled_text(draft)
            self.run_warm(draft)

    @work(thread=True, exclusive=True, group="warm")
    def run_warm(self, draft: str) -> None:
        """Worker thread: queue the warm-up and report its progress while it is long."""
        worker = get_current_worker()
        try:
            warm_up = self.service.warm_ahead(draft)
            if warm_up is None:
                return
            for event in warm_up.events():
                if worker.is_cancelled:
                    return
                if isinstance(event, PromptProgress) and event.total >= PROGRESS_FROM_TOKENS:
                    self.post_message(WarmProgress(event.done, event.total))
        except Exception:  # warming is an optimisation: the answer itself will say what is wrong
            return
        finally:
            self.post_message(WarmProgress(-1, -1))

    def on_warm_progress(self, message: WarmProgress) -> None:
        """Show a long warm-up; an answer sent meanwhile waits for it, so keep showing it then."""
        row = self.query_one(PrefillRow)
        streaming = self.flight is not None and self.flight.state is FlightState.ANSWERING
        if message.done < 0 or message.done >= message.total:
            if not self.answering:
                row.hide()
        elif not streaming:
            row.show_progress("reading the prompt" if self.answering else "warming up", message.done, message.total)

    # Selection, siblings, copy.
    def action_select(self, step: int) -> None:
        self.query_one(ChatLog).move_selection(step)

    async def action_sibling(self, step: int) -> None:
        if self._refuse_while_answering():
            return
        selected = self.query_one(ChatLog).selected
        if selected is None or selected.message_id is None or selected.version_count < 2:
            self.notify("This message has no other versions.", severity="information")
            return
        index = self.query_one(ChatLog).index_of(selected)
        message_id = selected.message_id
        await self._run_view_change(lambda: self.service.current.switch_sibling(message_id, step))
        log = self.query_one(ChatLog)
        if index < len(log.views):
            log.selected_index = index
            log.move_selection(0)

    def action_copy_message(self) -> None:
        selected = self.query_one(ChatLog).selected
        if selected is None:
            self.notify("No message to copy yet.", severity="warning")
            return
        self.app.copy_to_clipboard(selected.text)
        self.notify("Message copied to the clipboard.")

    def action_copy_code(self) -> None:
        selected = self.query_one(ChatLog).selected
        code = last_code_block(selected.text) if selected is not None else None
        if code is None:
            self.notify("The selected message has no code block.", severity="warning")
            return
        self.app.copy_to_clipboard(code)
        self.notify("Code block copied to the clipboard.")

    # Conversations.
    async def action_new_conversation(self) -> None:
        if self._refuse_while_answering():
            return
        persona = self._current_persona()
        await self._run_view_change(lambda: self.service.current.new_conversation(persona))
        self.query_one(Composer).focus()

    def _current_persona(self) -> PersonaRecord | None:
        name = self.branch.persona_name if self.branch is not None else None
        if not name:
            return None
        return attempt(self, lambda: self.service.personas.named(name))

    def action_rename(self) -> None:
        if self.branch is None:
            return

        def renamed(title: str | None) -> None:
            if title is None:
                return
            try:
                self.service.current.rename(title)
                self.branch = self.service.current.view()
            except ChatappError as error:
                self.notify(str(error), severity="error", timeout=10)
                return
            self.sub_title = self.branch.conversation.title
            self.refresh_conversations()

        self.app.push_screen(TextPrompt("Rename conversation", self.branch.conversation.title), renamed)

    def action_delete_conversation(self) -> None:
        if self.branch is not None:
            self._confirm_delete(self.branch.conversation.id)

    def _confirm_delete(self, conversation_id: int) -> None:
        if self._refuse_while_answering():
            return

        def delete_and_open_another() -> BranchView:
            self.service.current.delete(conversation_id)
            return self.service.current.open_latest_or_new()

        async def decided(yes: bool | None) -> None:
            if not yes:
                return
            if self.branch is not None and self.branch.conversation.id == conversation_id:
                await self._run_view_change(delete_and_open_another)
            else:
                attempt(self, lambda: self.service.current.delete(conversation_id))
                self.refresh_conversations()

        listed = attempt(self, self.service.current.list_conversations) or []
        title = next((c.title for c in listed if c.id == conversation_id), "this conversation")
        self.app.push_screen(Confirm(f"Delete “{title}” and all its branches?"), decided)

    def action_export(self) -> None:
        if self.branch is None:
            return
        default = str(Path.home() / f"{export_file_name(self.service.current.view())}.md")

        def chosen(path: str | None) -> None:
            if not path:
                return
            try:
                written = export_view(self.service.current.view(), user_path(path))
            except ChatappError as error:
                self.notify(str(error), severity="error", timeout=10)
                return
            self.notify(f"Branch exported to {written}")

        self.app.push_screen(TextPrompt("Export this branch to (.md or .json)", default), chosen)

    async def action_toggle_qa_mode(self) -> None:
        if self.branch is None or self._refuse_while_answering():
            return
        on = not self.branch.conversation.qa_mode

        def toggle() -> BranchView:
            self.service.current.set_qa_mode(on)
            return self.service.current.view()

        await self._run_view_change(toggle)
        self.notify("Q&A mode on: each question starts from the persona and document." if on else "Q&A mode off.")

    # Documents.
    def action_attach_document(self) -> None:
        if self._refuse_while_answering() or not self._model_ready():
            return

        def chosen(path: Path | None) -> None:
            if path is not None:
                self.documents.attach(path)

        self.app.push_screen(DocumentPicker(start_folder(self.service)), chosen)

    async def action_detach_document(self) -> None:
        if self._refuse_while_answering():
            return
        if self.branch is None or self.branch.document is None:
            self.notify("No document is attached to this branch.", severity="information")
            return
        await self._run_view_change(self.service.detach_document)

    # Focus and panels.
    def action_search(self) -> None:
        self.query_one("#sidebar").display = True
        self.query_one("#search").focus()

    def action_toggle_sidebar(self) -> None:
        sidebar = self.query_one("#sidebar")
        sidebar.display = not sidebar.display

    def action_focus_tree(self) -> None:
        self.query_one("#sidebar").display = True
        self.query_one(BranchTree).focus()

    def action_focus_composer(self) -> None:
        self.query_one(Composer).focus()

    async def use_persona(self, persona: PersonaRecord | None) -> None:
        if self._refuse_while_answering():
            return
        await self._run_view_change(lambda: self.service.set_persona(persona))
        self.notify(f"Persona: {persona.name if persona else 'none'} (a new branch from the start).")
