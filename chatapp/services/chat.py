"""A chat session: send a message, stream the answer, keep the conversation append-only.

Used by `chatapp ask` and the benchmark. It turns the conversation into prompt tokens,
submits them to the engine, and records the answer with its exact token ids so that
the next prompt extends this one token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

from chatapp.engine.contract import EngineClient
from chatapp.engine.events import GenerationResult
from chatapp.engine.handle import GenerationHandle
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.errors import ChatappError
from chatapp.services.boundaries import reuse_boundaries
from chatapp.services.conversation import Conversation
from chatapp.services.streams import EngineStream


class Reply(EngineStream):
    """An answer being generated; when it ends it joins the conversation (a failure takes the question back)."""

    def __init__(self, session: ChatSession, handle: GenerationHandle) -> None:
        super().__init__(handle)
        self._session = session

    def _on_end(self, result: GenerationResult) -> None:
        self._session.conversation.add_answer(result.text, result.token_ids)

    def _on_failure(self, error: BaseException) -> None:
        self._session.conversation.drop_last()


@dataclass
class ChatSession:
    """One conversation bound to the engine and to one of its sequences."""

    engine: EngineClient
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
            messages = self.conversation.prompt_messages()
            builder = self.engine.prompt_builder
            prompt = builder.build(messages)
            checkpoints = reuse_boundaries(builder, messages) if self.engine.takes_checkpoints else ()
            handle = self.engine.generate(
                GenerationRequest(
                    prompt_tokens=tuple(prompt),
                    sampling=self.sampling,
                    sequence=self.sequence,
                    use_cache=self.use_cache,
                    checkpoints=checkpoints,
                )
            )
        except BaseException:
            self.conversation.drop_last()
            raise
        return Reply(self, handle)
