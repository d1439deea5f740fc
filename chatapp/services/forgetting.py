"""Forgetting what the user deletes: the cache's entries that only a deleted conversation or persona used.

A prefix's KV state is, in effect, its text: a conversation deleted in the app would otherwise stay on
disk in the cache until eviction or its time to live. Deleting one removes from RAM and disk, at once,
every entry its branches' prompts may have stored that no other conversation and no persona still begins
with (a persona shared with other conversations stays, and so does a document another conversation is
about). The prompts are built as the chat builds them, on the loaded model; with none loaded (or with a
server's cache, which is the server's) nothing is removed here, and the entries go by eviction, by their
time to live or with `chatapp cache clear`.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from chatapp.engine.contract import EngineClient
from chatapp.records import MessageRecord, PersonaRecord
from chatapp.services.branches import as_document, branch_turns
from chatapp.services.messages import conversation_messages
from chatapp.services.prompt_plan import plan_for
from chatapp.services.warmup import next_question_plan
from chatapp.store.conversations import ConversationStore
from chatapp.store.personas import PersonaStore
from chatapp.vocabulary import Role

log = logging.getLogger(__name__)

Prompt = tuple[int, ...]


class Forgetting:
    """Builds the prompts of what is deleted and of what stays, and has the cache drop the difference.

    The deleted item's own prompts are built at once (its rows go right after); what stays is read, and the
    cache's work done, on a thread of its own: tokenizing every other conversation takes about a second per
    50 long ones, which the screen that deletes must not wait for. `wait` waits for it (close, tests)."""

    def __init__(
        self,
        conversations: ConversationStore,
        personas: PersonaStore,
        engine: Callable[[], EngineClient | None],
        settle: Callable[[], None] = lambda: None,
    ) -> None:
        """`settle`: stops what would store more of it meanwhile (a warm-up of the branch on screen)."""
        self._conversations = conversations
        self._personas = personas
        self._engine = engine
        self._settle = settle
        self._work: queue.Queue[Callable[[], None]] = queue.Queue()
        self._worker = threading.Thread(target=self._run, name="forgetting", daemon=True)
        self._worker.start()
        self.forgotten = 0  # cache entries removed so far (for the log and tests)

    def conversation(self, conversation_id: int) -> None:
        """Forget what only this conversation (about to be deleted) used."""
        self._forget(
            lambda engine: self._conversation_prompts(engine, conversation_id),
            lambda engine: self._kept(engine, skip_conversation=conversation_id),
        )

    def persona(self, persona: PersonaRecord) -> None:
        """Forget what only this persona (about to be deleted) used: its own warm-ahead, not the conversations
        that keep their copy of it."""
        self._forget(
            lambda engine: [self._persona_prompt(engine, persona.prompt)],
            lambda engine: self._kept(engine, skip_persona=persona.id),
        )

    def wait(self) -> None:
        """Until every deletion so far is forgotten."""
        self._work.join()

    def _forget(
        self,
        going: Callable[[EngineClient], list[Prompt]],
        staying: Callable[[EngineClient], list[Prompt]],
    ) -> None:
        engine = self._engine()
        if engine is None or engine.cache is None or engine.prompt_builder is None:
            return
        try:
            gone = going(engine)
        except Exception as error:  # the deletion goes ahead; the entries go by their time to live
            log.warning("could not read what is deleted (%s); its cache entries go by their time to live", error)
            return

        def forget() -> None:
            self._settle()
            removed = engine.forget_cached(gone, staying(engine))
            self.forgotten += removed
            log.info("forgot %d cache entries of what was deleted", removed)

        self._work.put(forget)

    def _run(self) -> None:
        while True:
            job = self._work.get()
            try:
                job()
            except Exception as error:  # the deletion went ahead; the entries go by their time to live
                log.warning(
                    "could not remove what was deleted from the cache (%s); `chatapp cache clear` wipes it", error
                )
            finally:
                job = None  # type: ignore[assignment]
                self._work.task_done()

    def _kept(
        self, engine: EngineClient, skip_conversation: int | None = None, skip_persona: int | None = None
    ) -> list[Prompt]:
        """The prompts of every conversation and persona that stays."""
        kept = [
            prompt
            for record in self._conversations.list_conversations()
            if record.id != skip_conversation
            for prompt in self._conversation_prompts(engine, record.id)
        ]
        kept += [
            self._persona_prompt(engine, persona.prompt)
            for persona in self._personas.list()
            if persona.id != skip_persona
        ]
        return kept

    def _conversation_prompts(self, engine: EngineClient, conversation_id: int) -> list[Prompt]:
        """Each branch's next-question prompt: every prompt the branch sent is a prefix of it."""
        records = self._conversations.messages(conversation_id)
        parents = {record.parent_id for record in records}
        leaves = [record for record in records if record.id not in parents]
        return [self._branch_prompt(engine, self._conversations.path(leaf.id)) for leaf in leaves]

    def _branch_prompt(self, engine: EngineClient, path: list[MessageRecord]) -> Prompt:
        """What the branch stored: the next question's beginning after an answer; after a question left without
        one (the app closed, the engine failed), the prompt that question sent."""
        root = path[0]
        document = as_document(self._conversations.get_document(root.document_id)) if root.document_id else None
        if path[-1].role is Role.USER:
            messages = conversation_messages(root.content, document, branch_turns(path[1:]))
            return plan_for(engine, messages).tokens
        return next_question_plan(engine, root.content, document, path[1:], "").tokens

    @staticmethod
    def _persona_prompt(engine: EngineClient, persona: str) -> Prompt:
        return next_question_plan(engine, persona, None, [], "").tokens
