"""Warm-ahead and type-ahead: compute the next prompt's KV before the user presses Enter.

The persona, document and history are known as soon as a conversation opens, and most of
a question is known while it is being typed. Prefill-only requests compute those tokens
in the background, so that on Enter the engine only has the last word, the closing text
and the assistant header left to evaluate. A warm-up is only useful if its tokens are a
prefix of the prompt finally sent: an edit to earlier text cancels it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from chatapp.documents import Document
from chatapp.engine.contract import EngineClient, GenerationHandle, GenerationRequest, SamplingParams
from chatapp.errors import ContextOverflowError
from chatapp.prompting.planner import PromptPlan, PromptPlanner, settled_text
from chatapp.prompting.prompt import ChatMessage
from chatapp.records import MessageRecord
from chatapp.services.branches import branch_turns
from chatapp.services.messages import conversation_messages, next_question_parts
from chatapp.vocabulary import Role

# Nothing is sampled; the request type still wants sampling settings.
_NO_SAMPLING = SamplingParams(temperature=0.0, max_tokens=1)


def draft_plan(
    engine: EngineClient, messages: list[ChatMessage], parts_before: tuple[str, ...], draft: str
) -> PromptPlan:
    """What to warm for `engine`: the draft's tokens, or (where its server builds prompts) its messages."""
    builder = engine.prompt_builder
    if builder is not None:
        return PromptPlan(tuple(PromptPlanner(builder).draft_tokens(messages, parts_before, draft)))
    parts = tuple(part for part in (*parts_before, settled_text(draft)) if part)
    if not parts:  # servers refuse an empty message: warm what comes before it
        return PromptPlan((), (), tuple(messages))
    return PromptPlan((), (), (*messages, ChatMessage.of(Role.USER, *parts)))


def next_question_plan(
    engine: EngineClient, persona: str, document: Document | None, history: Sequence[MessageRecord], draft: str
) -> PromptPlan:
    """What a branch's next question's prompt begins with while `draft` is typed: the persona, the document
    and the turns so far (every earlier prompt of the branch is a prefix of it, with the answers' tokens)."""
    turns = branch_turns(list(history))
    messages = conversation_messages(persona, document, turns)
    return draft_plan(engine, messages, next_question_parts(document, turns), draft)


def _is_prefix(head: Sequence[int], tokens: Sequence[int]) -> bool:
    return len(head) <= len(tokens) and tuple(tokens[: len(head)]) == tuple(head)


class Prewarmer:
    """Queues prefill-only requests for drafts and cancels the ones an edit made useless.

    Safe to call from any thread (the TUI calls it on keystrokes, the engine runs it on its
    own thread). Requests ask for no particular sequence, so the engine extends the one that
    already holds the longest prefix.
    """

    def __init__(self, engine: EngineClient) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._pending: list[tuple[tuple[int, ...], GenerationHandle]] = []
        self._last: tuple[int, ...] = ()
        self._last_messages: tuple[ChatMessage, ...] = ()

    @property
    def busy(self) -> bool:
        """Whether a warm-up is queued or running."""
        with self._lock:
            return any(not handle.done for _, handle in self._pending)

    def warm(
        self, tokens: Sequence[int], *, store: bool, messages: tuple[ChatMessage, ...] = ()
    ) -> GenerationHandle | None:
        """Start computing `tokens`; None when they add nothing over the last warm-up (or cannot fit).

        `store=False` for drafts: their KV stays resident for the real request but is not
        written to the cache's RAM and disk tiers. An engine whose server builds its prompts
        gets `messages` instead (and no tokens): a new draft replaces the warm-ups before it.
        """
        wanted = tuple(tokens)
        with self._lock:
            self._forget_finished()
            if messages and not wanted:
                if messages == self._last_messages:
                    return None
                self._cancel_unless_prefix_of(())
                self._last_messages = messages
            elif not wanted or _is_prefix(wanted, self._last):
                return None
            else:
                self._cancel_unless_prefix_of(wanted)
            request = GenerationRequest(
                wanted, _NO_SAMPLING, sequence=None, prefill_only=True, store=store, messages=messages
            )
            try:
                handle = self._engine.generate(request)
            except ContextOverflowError:
                return None  # too long to send as well; sending will say so
            self._pending.append((wanted, handle))
            self._last = wanted
            return handle

    def before_send(self, prompt: Sequence[int]) -> None:
        """Cancel the warm-ups that are not a start of `prompt`; the others finish as its prefill."""
        with self._lock:
            self._cancel_unless_prefix_of(tuple(prompt))

    def cancel(self) -> None:
        """Cancel every warm-up (the conversation changed, or the app is closing)."""
        with self._lock:
            for _, handle in self._pending:
                handle.cancel()
            self._pending.clear()
            self._last = ()
            self._last_messages = ()

    def wait(self) -> None:
        """Block until every warm-up queued so far has ended (for tests and benchmarks)."""
        with self._lock:
            handles = [handle for _, handle in self._pending]
        for handle in handles:
            handle.join()

    # With the lock held.
    def _cancel_unless_prefix_of(self, tokens: tuple[int, ...]) -> None:
        kept = []
        for warmed, handle in self._pending:
            if handle.done or _is_prefix(warmed, tokens):
                kept.append((warmed, handle))
            else:
                handle.cancel()
                if warmed == self._last:
                    self._last = ()
        self._pending = kept

    def _forget_finished(self) -> None:
        self._pending = [(warmed, handle) for warmed, handle in self._pending if not handle.done]
