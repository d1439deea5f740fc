"""The main screen: sidebar, the open branch, the message box and the status line.

It holds no model or cache logic, and little of its own: it lays out the widgets, maps keys and
widget events to the controllers that own each concern, and guards what may not run at once.

    BranchDisplay        the branch shown, the tree and the conversation list (branch_display.py)
    AnswerRunner         sending, regenerating, the answer in flight, Esc (answer_runner.py)
    QuestionEdit         editing a question as a new branch (question_edit.py)
    WarmAhead            warming the draft's prompt while the user types (warm_ahead.py)
    ConversationActions  new, rename, delete, export, Q&A mode, persona (conversation_actions.py)
    ModelSwitch          loading another model beside the one answering (model_switch.py)
    DocumentAttach       reading and attaching a document (document_attach.py)

Answers and warm-ups run in worker threads; their events arrive here as Textual messages,
so the screen never blocks.
"""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header

from chatapp.errors import ChatappError
from chatapp.services.chat_service import ChatService
from chatapp.tui import commands
from chatapp.tui.answer_runner import AnswerRunner, AnswerSiblings
from chatapp.tui.branch_display import BranchDisplay
from chatapp.tui.chat_widgets import ChatWidgets
from chatapp.tui.composer import Composer
from chatapp.tui.conversation_actions import ConversationActions
from chatapp.tui.document_attach import DocumentAttach
from chatapp.tui.messages import AnswerEvent, WarmProgress
from chatapp.tui.model_switch import ModelSwitch
from chatapp.tui.question_edit import QuestionEdit
from chatapp.tui.sidebar import ConversationList, Sidebar
from chatapp.tui.warm_ahead import WarmAhead
from chatapp.tui.widgets import StatusLine, last_code_block


class MainScreen(Screen[None]):
    BINDINGS = commands.bindings()
    # A narrow terminal (80 columns is common) gives the chat most of the width: the sidebar narrows,
    # and below 60 columns it starts hidden (Ctrl+B shows it).
    HORIZONTAL_BREAKPOINTS = [(0, "-tiny"), (60, "-narrow"), (100, "-roomy")]

    def __init__(self, service: ChatService) -> None:
        super().__init__()
        self.service = service
        self._model_failed = False
        self.widgets = widgets = ChatWidgets.make(self.post_message)
        self.edit = QuestionEdit(widgets, lambda: service.slot.ready)
        self.warm = WarmAhead(
            widgets, service, lambda: not self.answering and self.edit.editing is None, lambda: self.answers.streaming
        )
        self.shown = BranchDisplay(
            widgets, service, self._leave_view, lambda: self.warm.ahead(widgets.composer.text), self._titled
        )
        self.model_switch = ModelSwitch(widgets, service, lambda: self.answering, self.engine_ready)
        self.answers = AnswerRunner(
            widgets, service, AnswerSiblings(self.edit, self.shown, self.warm, self.model_switch)
        )
        self.conversations = ConversationActions(widgets, service, self.shown, self.refuse_while_busy, self._titled)
        self.documents = DocumentAttach(widgets, service, self.shown.change, lambda: self.shown.branch)

    @property
    def answering(self) -> bool:
        """Whether an answer is in flight (set before any await: a second Enter cannot start another)."""
        return self.answers.flight is not None

    @property
    def status(self) -> StatusLine:
        return self.widgets.status

    def _titled(self, title: str) -> None:
        self.sub_title = title

    def compose(self) -> ComposeResult:
        widgets = self.widgets
        yield Header(show_clock=False)
        with Horizontal(id="main"):
            yield widgets.sidebar
            with Vertical(id="chat"):
                yield widgets.info
                yield widgets.log
                yield widgets.prefill
                yield widgets.composer
                yield widgets.status
        yield Footer()

    async def on_mount(self) -> None:
        self.widgets.log.anchor()
        self.widgets.prefill.hide()
        self.widgets.composer.focus()
        try:
            self.shown.branch = self.service.current.open_latest_or_new()
        except ChatappError as error:
            self.notify(str(error), severity="error", timeout=15)
            return
        await self.shown.show()
        self.shown.refresh_conversations()

    # Called by the app.
    def engine_ready(self, model_label: str) -> None:
        device = self.service.slot.offload_device()
        label = f"{model_label} on {device}" if device else model_label
        self.status.model = f"{label} (flash attention)" if self.service.slot.flash_attention() else label
        self.status.context_size = self.service.slot.context_size()
        self.status.state = "ready"
        self.shown.update_info()
        self.shown.show_as_the_model_reads(self.answering)
        self.warm.ahead("")
        self.model_switch.follow_conversation()

    def engine_failed(self, reason: str) -> None:
        self._model_failed = True
        self.status.model = "no model"
        self.status.state = "no model loaded: " + reason

    # Guards.
    def refuse_while_busy(self) -> bool:
        """True (and the user told why) while an answer runs or a document is read."""
        if self.answering:
            self.notify("An answer is still running; press Esc to stop it first.", severity="warning")
        elif self.documents.reading:
            self.notify("A document is being read; wait a moment.", severity="warning")
        return self.answering or self.documents.reading

    def _model_ready(self) -> bool:
        if self._model_failed:
            self.notify("No model is loaded: fix the model setting (F5) and restart chatapp.", severity="error")
        elif not self.service.slot.ready:
            self.notify("The model is still loading; try again in a moment.", severity="warning")
        return self.service.slot.ready

    def _leave_view(self) -> None:
        """Another branch is about to be shown: an edit of this one ends, and its progress row."""
        if self.edit.editing is not None:
            self.edit.cancel()
        self.widgets.prefill.hide()

    # Widget events.
    @on(Sidebar.SearchChanged)
    def _search(self, event: Sidebar.SearchChanged) -> None:
        self.shown.refresh_conversations(event.query)

    @on(Sidebar.ConversationChosen)
    async def _open_conversation(self, event: Sidebar.ConversationChosen) -> None:
        if self.refuse_while_busy():
            return
        await self.shown.change(lambda: self.service.current.open(event.conversation_id))
        self.widgets.composer.focus()
        self.model_switch.follow_conversation()

    @on(Sidebar.BranchChosen)
    async def _jump(self, event: Sidebar.BranchChosen) -> None:
        if not self.refuse_while_busy():
            await self.shown.change(lambda: self.service.current.jump_to(event.message_id))

    @on(ConversationList.DeleteRequested)
    def _delete_from_list(self, event: ConversationList.DeleteRequested) -> None:
        self.conversations.delete(event.conversation_id)

    @on(Composer.Submitted)
    async def _submitted(self, event: Composer.Submitted) -> None:
        if not event.text.strip():
            return
        if not self._model_ready() or self.refuse_while_busy():
            self.widgets.composer.give_back(event.text)
            return
        await self.answers.send(event.text)

    @on(Composer.EditLast)
    def _edit_last(self) -> None:
        question = self.edit.last_question()
        if question is not None and not self.refuse_while_busy():
            self.edit.begin(question)

    @on(Composer.Changed)
    def _typing(self, event: Composer.Changed) -> None:
        self.warm.typed(event.text_area.text)

    @on(AnswerEvent)
    async def _answer_event(self, message: AnswerEvent) -> None:
        await self.answers.handle(message)

    @on(WarmProgress)
    def _warm_progress(self, message: WarmProgress) -> None:
        self.warm.progress(message, self.answering)

    # Actions (keys and the command palette: commands.py).
    def action_stop(self) -> None:
        if self.answers.stop():
            return
        if self.edit.editing is not None:
            self.edit.cancel()
        elif not self.model_switch.cancel():
            self.service.stop_warming()
            self.widgets.prefill.hide()

    async def action_regenerate(self) -> None:
        if not self.refuse_while_busy() and self._model_ready():
            await self.answers.regenerate()

    def action_edit_question(self) -> None:
        question = self.edit.selected_question()
        if question is None:
            self.notify("No question to edit yet.", severity="warning")
        elif not self.refuse_while_busy():
            self.edit.begin(question)

    def action_select(self, step: int) -> None:
        self.widgets.log.move_selection(step)

    async def action_sibling(self, step: int) -> None:
        if self.refuse_while_busy():
            return
        log = self.widgets.log
        selected = log.selected
        if selected is None or selected.message_id is None or selected.version_count < 2:
            self.notify("This message has no other versions.", severity="information")
            return
        index = log.index_of(selected)
        message_id = selected.message_id
        await self.shown.change(lambda: self.service.current.switch_sibling(message_id, step))
        if index < len(log.views):
            log.selected_index = index
            log.move_selection(0)

    def action_copy(self, what: str) -> None:
        """Copy the selected message ('message') or its last code block ('code') to the clipboard."""
        selected = self.widgets.log.selected
        if selected is None:
            self.notify("No message to copy yet.", severity="warning")
            return
        text = selected.text if what == "message" else last_code_block(selected.text)
        if text is None:
            self.notify("The selected message has no code block.", severity="warning")
            return
        self.app.copy_to_clipboard(text)
        self.notify("Message copied to the clipboard." if what == "message" else "Code block copied to the clipboard.")

    async def action_conversation(self, command: str) -> None:
        await self.conversations.run(command)

    async def action_document(self, command: str) -> None:
        """Attach a document to a new branch ('attach'), or start one without it ('detach')."""
        if self.refuse_while_busy():
            return
        if command == "attach":
            if self._model_ready():
                self.documents.choose()
        elif self.shown.branch is None or self.shown.branch.document is None:
            self.notify("No document is attached to this branch.", severity="information")
        else:
            await self.shown.change(self.service.detach_document)

    def action_show(self, panel: str) -> None:
        """Focus the conversation search ('search'), the branch tree ('tree') or the message box ('composer')."""
        if panel == "composer":
            self.widgets.composer.focus()
            return
        self.widgets.sidebar.display = True
        (self.widgets.sidebar.search if panel == "search" else self.widgets.sidebar.branch_tree).focus()

    def action_toggle_sidebar(self) -> None:
        sidebar = self.widgets.sidebar
        sidebar.display = not sidebar.display
