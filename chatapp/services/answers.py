"""An answer being generated for a conversation, saved as it streams.

The assistant message is written to the database with the first token and refreshed
every couple of seconds while the answer streams, so a crash or a kill keeps what was
already said (marked as cut off); when the answer ends its final text, exact token ids,
status and figures replace the draft.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from chatapp.engine.contract import GenerationHandle, GenerationResult
from chatapp.records import MessageRecord
from chatapp.services.answer_run import AnswerRun, EndedAnswer
from chatapp.services.streams import AnswerText
from chatapp.store.conversations import ConversationStore
from chatapp.vocabulary import MessageStatus, Role

SAVE_EVERY_S = 2.0
log = logging.getLogger(__name__)


class AnswerJob(AnswerRun):
    """Iterate `events()` on a worker thread; `cancel()` from anywhere; then read `answer`.

    `on_end` hears of the result once it is saved (the service keeps the session's figures).
    """

    def __init__(
        self,
        store: ConversationStore,
        handle: GenerationHandle,
        question: MessageRecord,
        on_end: Callable[[GenerationResult], None] | None = None,
        model: str = "",
    ) -> None:
        """`model`: the name of the model answering, kept with the answer's figures."""
        super().__init__(handle)
        self.store = store
        self.question = question
        self.answer: MessageRecord | None = None
        self._on_end_callback = on_end
        self._pieces: list[str] = []
        self._token_ids: list[int] = []
        self._saved_at = time.monotonic()
        self._model = model

    def _keep_text(self, piece: AnswerText) -> None:
        self._pieces.append(piece.text)
        if piece.token_id >= 0:
            self._token_ids.append(piece.token_id)
        if self.answer is None or time.monotonic() - self._saved_at > SAVE_EVERY_S:
            self._save("".join(self._pieces), self._token_ids, MessageStatus.PARTIAL, None)
            self._saved_at = time.monotonic()

    def _keep_answer(self, answer: EndedAnswer) -> None:
        figures = answer.figures()
        if figures is not None and self._model:
            figures = {**figures, "model": self._model}
        self._save(answer.text, list(answer.token_ids or ()), MessageStatus.after(answer.stop_reason), figures)
        if self._on_end_callback is not None and answer.result is not None:
            self._on_end_callback(answer.result)

    def _keep_failure(self, error: Exception, partial: EndedAnswer) -> None:
        """The engine failed midway: keep what was said, marked as failed (the error goes to the caller)."""
        if not partial.text:
            return
        try:
            self._save(partial.text, list(partial.token_ids or ()), MessageStatus.after(partial.stop_reason), None)
        except Exception:  # the engine's error is the one to report
            log.exception("could not mark a failed answer")

    def _save(self, text: str, token_ids: list[int], status: MessageStatus, stats: dict[str, Any] | None) -> None:
        if self.answer is None:
            self.answer = self.store.add_message(
                self.question.conversation_id,
                self.question.id,
                Role.ASSISTANT,
                text,
                generated_ids=tuple(token_ids),
                stats=stats,
                status=status,
            )
        else:
            self.answer = self.store.update_message(
                self.answer.id, content=text, generated_ids=tuple(token_ids), stats=stats, status=status
            )
