"""A chat session: send a message, stream the answer, keep the conversation append-only.

Used by the TUI and by `chatapp ask`. It turns the conversation into prompt tokens,
submits them to the engine, and records the answer with its exact token ids so that
the next prompt extends this one token for token.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from chatapp.engine.engine import Engine, GenerationHandle, GenerationRequest
from chatapp.engine.events import GenerationResult, PrefillProgress, TokenText
from chatapp.engine.llama_native import SamplingParams
from chatapp.errors import ChatappError
from chatapp.services.conversation import Conversation


class Reply:
    """An answer being generated. Iterate `events()`, then read `result`; `cancel()` any time."""

    def __init__(self, session: ChatSession, handle: GenerationHandle) -> None:
        self._session = session
        self._handle = handle
        self.result: GenerationResult | None = None

    def events(self) -> Iterator[PrefillProgress | TokenText]:
        """Stream progress and text; when it ends, the answer joins the conversation."""
        try:
            yield from self._handle.events()
        except BaseException:
            self._session.conversation.drop_last()
            raise
        self.result = self._handle.wait()
        self._session.conversation.add_answer(self.result.text, self.result.token_ids)

    def wait(self) -> GenerationResult:
        for _ in self.events():
            pass
        assert self.result is not None
        return self.result

    def cancel(self) -> None:
        self._handle.cancel()


@dataclass
class ChatSession:
    """One conversation bound to the engine and to one of its sequences."""

    engine: Engine
    conversation: Conversation
    sampling: SamplingParams
    sequence: int | None = None  # None: the engine picks
    use_cache: bool = True

    def send(self, text: str) -> Reply:
        """Add a user message and start the answer; raise ChatappError if it cannot start."""
        if not text.strip():
            raise ChatappError("the message is empty; type something first")
        self.conversation.add_user(text)
        try:
            prompt = self.engine.prompt_builder.build(self.conversation.prompt_messages())
            handle = self.engine.generate(
                GenerationRequest(
                    prompt_tokens=tuple(prompt),
                    sampling=self.sampling,
                    sequence=self.sequence,
                    use_cache=self.use_cache,
                )
            )
        except BaseException:
            self.conversation.drop_last()
            raise
        return Reply(self, handle)
