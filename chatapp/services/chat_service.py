"""What the TUI can do with conversations: ask, branch, switch persona or document, warm up.

The TUI calls this layer and never the engine, the cache or the database directly. The model
answering is the service's `slot` (engine_slot.py: load, switch, retire); the conversation open
and the branch on screen are its `current` (open_conversation.py). Quick operations (listing,
switching branches) run on the caller's thread; `ask`, `regenerate` and `edit` return an
`AnswerJob` whose events a worker thread consumes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chatapp.documents import Document, load_document
from chatapp.engine.contract import GenerationHandle, GenerationResult
from chatapp.errors import ChatappError
from chatapp.prompting.planner import PromptPlan
from chatapp.prompting.prompt import ChatMessage
from chatapp.records import DocumentRecord, MessageRecord, PersonaRecord
from chatapp.services.answers import AnswerJob
from chatapp.services.branches import BranchView, as_document, branch_turns, prompt_messages
from chatapp.services.divergence import Divergence
from chatapp.services.engine_slot import EngineSlot
from chatapp.services.forgetting import Forgetting
from chatapp.services.messages import Turn, conversation_messages
from chatapp.services.model_choice import file_fit_problem
from chatapp.services.open_conversation import NEW_TITLE, OpenConversation
from chatapp.services.personas import PersonaService
from chatapp.services.prompt_plan import TooLongWording, check_fits
from chatapp.services.startup import Workspace, engine_notices
from chatapp.services.streams import EngineStream
from chatapp.services.warmup import next_question_plan
from chatapp.store.conversations import ConversationStore
from chatapp.store.personas import PersonaStore
from chatapp.store.pins import PinStore
from chatapp.vocabulary import ReuseTier, Role

log = logging.getLogger(__name__)

SETTINGS_KEY = "(F5)"
TITLE_CHARACTERS = 60


def title_from(text: str) -> str:
    """A conversation's title: the first line of its first question, shortened."""
    line = text.strip().splitlines()[0] if text.strip() else NEW_TITLE
    return line if len(line) <= TITLE_CHARACTERS else line[: TITLE_CHARACTERS - 1].rstrip() + "…"


@dataclass(frozen=True)
class PreparedDocument:
    """A document read and measured for one conversation's branch, not yet attached."""

    document: Document
    source_path: str
    tokens: int | None  # with the persona; None where the server builds the prompts (it alone knows)
    conversation_id: int
    root_id: int


@dataclass
class SessionFigures:
    """Figures of this session's answers, for the status line and the sparkline."""

    ttft_ms: list[float] = field(default_factory=list)
    last_divergence: Divergence | None = None  # the last prompt that left an earlier one, and where
    prompt_tokens: int = 0
    reused_tokens: int = 0  # as the engine reported them (a remote server's own count)
    unreported: int = 0  # answers whose server did not say what it reused


class ChatService:
    """Conversations as trees of branches, answered by the engine, warmed ahead of time."""

    def __init__(
        self,
        workspace: Workspace,
        conversations: ConversationStore,
        personas: PersonaStore,
        pins: PinStore | None = None,
    ) -> None:
        self.slot = EngineSlot(workspace)  # the model answering, and one prepared for a switch
        self.conversations = conversations
        # What is deleted, removed from the cache (off this thread).
        self.forgetting = Forgetting(conversations, personas, lambda: self.slot.engine, self._settle_warming)
        self.personas = PersonaService(personas, self.forgetting.persona)
        self.pins = pins
        self.current = OpenConversation(conversations, self.slot.display_builder, self.forgetting.conversation)
        self.figures = SessionFigures()
        self._prefix_tokens: dict[tuple[str, int], int | None] = {}  # (persona prompt, document id) → tokens

    @property
    def workspace(self) -> Workspace:
        """The settings and the model answering (another after a switch)."""
        return self.slot.workspace

    # The model.
    def load_model(self) -> None:
        """Load the model and open its KV cache: slow, so call it off the UI thread.

        The latest conversation opens first: when it was answered with another model, still on disk
        and fitting in memory, that model is loaded instead of the settings' (not one, then the
        other); the settings' model when it fails. A ChatappError names the problem and the fix. If
        the service was closed meanwhile (the user quit while the model loaded), the model is closed
        again at once.
        """
        remembered = self._latest_conversation_s_model()
        if remembered is not None:
            workspace = self.workspace.with_model(remembered)
            try:
                engine = workspace.open_engine()
            except ChatappError as error:
                log.warning("could not load %s, the latest conversation's model: %s", remembered, error)
            else:
                self.slot.workspace = workspace
                self.slot.attach(engine)
                return
        self.slot.attach(self.workspace.open_engine())

    def _latest_conversation_s_model(self) -> Path | None:
        """The other model the conversation opened first was answered with, when it can be loaded now."""
        if self.workspace.remote is not None:
            return None
        try:
            latest = self.current.list_conversations()
            remembered = latest[0].model if latest else None
            if not remembered or not Path(remembered).is_file():
                return None
            if Path(remembered).resolve() == self.workspace.model_path.resolve() or file_fit_problem(Path(remembered)):
                return None
        except (ChatappError, OSError):  # the settings' model then says what is wrong with it
            return None
        return Path(remembered)

    def switch_to_prepared(self, cancelled: threading.Event | None = None) -> str:
        """Answer with the model the slot prepared from now on; returns its label (EngineSlot.switch_to_prepared).

        The open conversation remembers the model.
        """
        path = self.slot.switch_to_prepared(cancelled)
        self._prefix_tokens.clear()  # counted with the old model's vocabulary
        if self.current.conversation_id is not None:
            try:
                self.conversations.set_model(self.current.conversation_id, str(path))
            except ChatappError:  # switched all the same: the conversation forgets which model it had
                log.warning("could not note the conversation's model", exc_info=True)
        return self.slot.model_label()

    def remembered_model(self) -> Path | None:
        """The model the open conversation was answered with, when it is another one still on disk."""
        if self.current.conversation_id is None or self.slot.engine is None:
            return None
        remembered = self.current.record().model
        current = self.slot.model_path()
        if not remembered or current is None or not Path(remembered).is_file():
            return None
        return None if Path(remembered).resolve() == current.resolve() else Path(remembered)

    def _remember_model(self) -> None:
        path = self.slot.model_path()
        if self.current.conversation_id is not None and path is not None and self.current.record().model != str(path):
            self.conversations.set_model(self.current.conversation_id, str(path))

    def close(self) -> None:
        """Stop what runs and free the model (the conversations database is the library's to close)."""
        self.forgetting.wait()  # a deletion's entries leave the cache before the cache closes
        self.slot.close()

    def startup_notices(self) -> list[str]:
        """What the user should hear once after loading: how a server is driven, the cache off, a disk tier repaired."""
        engine = self.slot.engine
        if engine is None:
            return []
        notices = engine_notices(engine)
        if (notice := self.slot.take_cache_notice()) and notice not in notices:
            notices.append(notice)
        return notices

    # Persona and document: each starts a branch from a new root (or returns to a matching one).
    def set_persona(self, persona: PersonaRecord | None) -> BranchView:
        root = self.current.view().root
        return self.current.switch_root(
            persona.name if persona else None, persona.prompt if persona else "", root.document_id
        )

    def prepare_document(self, path: Path) -> PreparedDocument:
        """Read the file and check it fits the context with the open branch's persona.

        Slow for a long PDF: run it off the UI thread, then `attach_prepared` on it. Nothing
        is written here, so switching conversation meanwhile loses nothing.
        """
        document = load_document(path)
        view = self.current.view()
        tokens = self.prefix_tokens(view.root, document)
        wording = TooLongWording(
            f"document {document.name} with the persona",
            f"use a shorter document or a larger context_cap in the settings {SETTINGS_KEY}",
            about_document=True,
        )
        if tokens is not None:
            check_fits(self.slot.running()[0], tokens, wording)
        return PreparedDocument(document, str(path.expanduser()), tokens, view.conversation.id, view.root.id)

    def attach_prepared(self, prepared: PreparedDocument) -> BranchView:
        """Start a branch about the document, in the conversation and persona it was read for."""
        view = self.current.view()
        if view.conversation.id != prepared.conversation_id or view.root.id != prepared.root_id:
            raise ChatappError(
                f"{prepared.document.name} was not attached: the conversation "
                "or persona changed while it was read; attach it again"
            )
        record = self.conversations.add_document(prepared.document.name, prepared.document.text, prepared.source_path)
        self._prefix_tokens[(view.root.content, record.id)] = prepared.tokens
        return self.current.switch_root(view.root.persona_name, view.root.content, record.id)

    def attach_document(self, path: Path) -> tuple[BranchView, int | None]:
        """Read, check and attach in one call (for callers that need no thread hop)."""
        prepared = self.prepare_document(path)
        return self.attach_prepared(prepared), prepared.tokens

    def detach_document(self) -> BranchView:
        root = self.current.view().root
        return self.current.switch_root(root.persona_name, root.content, None)

    def document_tokens(self, document: DocumentRecord) -> int | None:
        """The open branch's persona + this document in tokens (None until the model is loaded)."""
        root = self.current.view().root
        key = (root.content, document.id)
        if key not in self._prefix_tokens:
            if self.slot.engine is None:
                return None
            self._prefix_tokens[key] = self.prefix_tokens(root, as_document(document))
        return self._prefix_tokens[key]

    def prefix_tokens(self, root: MessageRecord, document: Document | None) -> int | None:
        """The persona and document in tokens; None where the server builds the prompts (it alone knows)."""
        plan = self.next_question_plan(root, document, [], "")
        return len(plan.tokens) if plan.tokens else None

    # Answers.
    def ask(self, text: str) -> AnswerJob:
        """A new question after the active leaf (or from the root in Q&A mode)."""
        view = self.current.view()
        return self._ask(view, self._question_parent(view), text)

    def _question_parent(self, view: BranchView) -> MessageRecord:
        """Where the next question goes: after the last answer, or from the root in Q&A mode.

        A question left without an answer (the app closed while it was read) is replaced by
        the new one, as a sibling: two questions in a row would break most chat templates.
        """
        if view.conversation.qa_mode:
            return view.root
        leaf = view.leaf
        if leaf.role == Role.USER and leaf.parent_id is not None:
            return self.conversations.get_message(leaf.parent_id)
        return leaf

    def edit(self, message_id: int, text: str) -> AnswerJob:
        """Ask an edited version of a question: a sibling branch beside the original."""
        original = self.conversations.get_message(message_id)
        if original.role != Role.USER or original.parent_id is None:
            raise ChatappError("only your own messages can be edited; pick a message of yours")
        view = self.current.view()
        if original.conversation_id != view.conversation.id:
            raise ChatappError("that question is in another conversation; open it to edit the question")
        return self._ask(view, self.conversations.get_message(original.parent_id), text)

    def regenerate(self, message_id: int) -> AnswerJob:
        """Answer a question again (given the question or one of its answers): a sibling answer."""
        message = self.conversations.get_message(message_id)
        question = (
            self.conversations.get_message(message.parent_id)
            if message.role == Role.ASSISTANT and message.parent_id
            else message
        )
        if question.role != Role.USER:
            raise ChatappError("there is no question to answer again here; ask one first")
        path = self.conversations.path(question.id)
        document = self._root_document(path[0])
        messages = prompt_messages(path[0], document, path[1:])
        handle, answered = self._generate(messages, document)
        return AnswerJob(self.conversations, handle, question, answered, model=self.slot.model_label())

    def _ask(self, view: BranchView, parent: MessageRecord, text: str) -> AnswerJob:
        if not text.strip():
            raise ChatappError("the message is empty; type something first")
        path = self.conversations.path(parent.id)
        document = self._root_document(path[0])
        turns = [*branch_turns(path[1:]), Turn(Role.USER, text)]
        messages = conversation_messages(path[0].content, document, turns)
        handle, answered = self._generate(messages, document)
        try:
            question = self.conversations.add_message(view.conversation.id, parent.id, Role.USER, text)
            if view.conversation.title == NEW_TITLE:
                self.conversations.rename(view.conversation.id, title_from(text))
        except BaseException:
            handle.cancel()  # the question could not be saved: no answer nobody will see
            raise
        return AnswerJob(self.conversations, handle, question, answered, model=self.slot.model_label())

    def _generate(
        self, messages: list[ChatMessage], document: Document | None
    ) -> tuple[GenerationHandle, Callable[[GenerationResult], None]]:
        """The answer started, and what to do with its result (its figures, where its prompt diverged)."""
        answers = self.slot.answer_start()
        self._remember_model()
        started = answers.start(answers.plan(messages), self.workspace.sampling(), _branch_too_long(document))
        return started.handle, lambda result: self._answered(result, started.divergence)

    def _answered(self, result: GenerationResult, divergence: Divergence | None) -> None:
        """An answer's figures; where its prompt left an earlier one, when that is the one its tokens came from
        (reused tokens from a prompt this session never saw: where it left that one is not known here)."""
        figures, stats = self.figures, result.stats
        if divergence is not None and divergence.concerns(stats.reused_tokens):
            figures.last_divergence = divergence
        figures.ttft_ms.append(stats.ttft_ms)
        figures.prompt_tokens += stats.prompt_tokens
        figures.reused_tokens += stats.reused_tokens
        figures.unreported += stats.reuse_tier is ReuseTier.UNREPORTED

    def _root_document(self, root: MessageRecord) -> Document | None:
        return as_document(self.conversations.get_document(root.document_id)) if root.document_id else None

    # Warm-ahead and type-ahead.
    def warm_ahead(self, draft: str = "") -> EngineStream | None:
        """Compute the start of the next question's prompt while the user types.

        With an empty draft this is the persona, document and history (kept in the cache
        for later); with a draft it is also the settled part of what is being typed (kept
        only in the context: half-typed questions are not worth disk space). The setting
        `warm_ahead = false` turns it off (on a shared backend server, say).
        """
        if self.current.conversation_id is None or not self.workspace.settings.warm_ahead:
            return None
        try:
            engine, prewarmer = self.slot.running()
        except ChatappError:
            return None  # nothing to warm without a model
        view = self.current.view()
        path = self.conversations.path(self._question_parent(view).id)
        document = self._root_document(path[0])
        plan = self.next_question_plan(path[0], document, path[1:], draft)
        limit = engine.info.n_ctx_per_sequence
        if limit and len(plan.tokens) >= limit:
            return None
        handle = prewarmer.warm(plan.tokens, store=not draft.strip(), messages=plan.messages)
        return EngineStream(handle) if handle is not None else None

    def next_question_tokens(
        self, root: MessageRecord, document: Document | None, history: list[MessageRecord], draft: str
    ) -> list[int]:
        """The tokens of `next_question_plan` (none where the server builds the prompts)."""
        return list(self.next_question_plan(root, document, history, draft).tokens)

    def next_question_plan(
        self, root: MessageRecord, document: Document | None, history: list[MessageRecord], draft: str
    ) -> PromptPlan:
        """What the next question's prompt begins with while `draft` is typed (tokens, or messages)."""
        return next_question_plan(self.slot.running()[0], root.content, document, history, draft)

    def stop_warming(self) -> None:
        prewarmer = self.slot.prewarmer
        if prewarmer is not None:
            prewarmer.cancel()

    def _settle_warming(self) -> None:
        """Stop warming and wait for it: a warm-up still running would store what is being deleted again."""
        self.stop_warming()
        if (prewarmer := self.slot.prewarmer) is not None:
            prewarmer.wait()


def _branch_too_long(document: Document | None) -> TooLongWording:
    """How the TUI words a branch that does not fit (the fixes name its keys)."""
    if document is None:
        return TooLongWording("this branch", f"start a new conversation (Ctrl+N) or raise context_cap {SETTINGS_KEY}")
    return TooLongWording(
        "the document and this branch",
        f"use Q&A mode (Ctrl+T), a shorter document or a larger context_cap {SETTINGS_KEY}",
        about_document=True,
    )
