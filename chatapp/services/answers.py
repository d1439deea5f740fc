"""An answer being generated for a conversation, saved as it streams.

The assistant message is written to the database with the first token and refreshed
every couple of seconds while the answer streams, so a crash or a kill keeps what was
already said (marked as cut off); when the answer ends its final text, exact token ids,
status and figures replace the draft.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from chatapp.engine.engine import GenerationHandle
from chatapp.engine.events import STOP_CANCELLED, STOP_CONTEXT, STOP_LENGTH, GenerationResult, PrefillProgress, TokenText
from chatapp.engine.prompt import ASSISTANT
from chatapp.store.conversations import ConversationStore
from chatapp.store.records import MessageRecord

SAVE_EVERY_S = 2.0
STATUS_COMPLETE = "complete"
STATUS_STOPPED = "stopped"
STATUS_CUT_OFF = "cut_off"
STATUS_PARTIAL = "partial"
STATUS_BY_STOP = {STOP_CANCELLED: STATUS_STOPPED, STOP_LENGTH: STATUS_CUT_OFF, STOP_CONTEXT: STATUS_CUT_OFF}


def stats_record(result: GenerationResult, *, ms_digits: int = 1) -> dict[str, Any]:
    """The figures of an answer: kept with it in the database, printed by `ask --json`."""
    stats = result.stats
    return {
        "prompt_tokens": stats.prompt_tokens,
        "reused_tokens": stats.reused_tokens,
        "computed_tokens": stats.computed_tokens,
        "reuse_tier": stats.reuse_tier,
        "generated_tokens": stats.generated_tokens,
        "ttft_ms": round(stats.ttft_ms, ms_digits),
        "total_ms": round(stats.total_ms, ms_digits),
        "decode_tokens_per_s": round(stats.decode_tokens_per_s, 2),
        "stop_reason": result.stop_reason,
    }


class AnswerJob:
    """Iterate `events()` on a worker thread; `cancel()` from anywhere; then read `answer`."""

    def __init__(self, store: ConversationStore, handle: GenerationHandle, question: MessageRecord) -> None:
        self.store = store
        self.handle = handle
        self.question = question
        self.answer: MessageRecord | None = None
        self.result: GenerationResult | None = None

    def cancel(self) -> None:
        self.handle.cancel()

    def events(self) -> Iterator[PrefillProgress | TokenText]:
        pieces: list[str] = []
        token_ids: list[int] = []
        saved_at = time.monotonic()
        for event in self.handle.events():
            if isinstance(event, TokenText):
                pieces.append(event.text)
                if event.token_id >= 0:
                    token_ids.append(event.token_id)
                if self.answer is None or time.monotonic() - saved_at > SAVE_EVERY_S:
                    self._save("".join(pieces), token_ids, STATUS_PARTIAL, None)
                    saved_at = time.monotonic()
            yield event
        result = self.handle.wait()
        self.result = result
        self._save(result.text, list(result.token_ids), STATUS_BY_STOP.get(result.stop_reason, STATUS_COMPLETE), stats_record(result))

    def wait(self) -> GenerationResult:
        for _ in self.events():
            pass
        assert self.result is not None
        return self.result

    def _save(self, text: str, token_ids: list[int], status: str, stats: dict[str, Any] | None) -> None:
        if self.answer is None:
            self.answer = self.store.add_message(
                self.question.conversation_id,
                self.question.id,
                ASSISTANT,
                text,
                generated_ids=tuple(token_ids),
                stats=stats,
                status=status,
            )
        else:
            self.answer = self.store.update_message(
                self.answer.id, content=text, generated_ids=tuple(token_ids), stats=stats, status=status
            )
