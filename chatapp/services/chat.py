"""A chat session held in memory: send a message, stream the answer, keep the conversation append-only.

Used by `chatapp ask`. The conversation's messages, the prompt plan and the answer run are
the pipeline's (messages.py, prompt_plan.py, answer_run.py); this module is only the sink
that keeps the answer in memory, with its exact token ids, so the next prompt extends this
one token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

from chatapp.engine.contract import EngineClient, GenerationHandle, SamplingParams
from chatapp.errors import ChatappError
from chatapp.services.answer_run import AnswerRun, EndedAnswer
from chatapp.services.answer_start import AnswerStart
from chatapp.services.conversation import Conversation
from chatapp.services.prompt_plan import TooLongWording


class Reply(AnswerRun):
    """An answer being generated; when it ends it joins the conversation (a failure takes the question back)."""

    def __init__(self, session: ChatSession, handle: GenerationHandle, stops: tuple[str, ...]) -> None:
        super().__init__(handle, stops)
        self._session = session

    def _keep_answer(self, answer: EndedAnswer) -> None:
        self._session.conversation.add_answer(answer.text, answer.token_ids)

    def _keep_failure(self, error: Exception, partial: EndedAnswer) -> None:
        self._session.conversation.drop_last()


@dataclass
class ChatSession:
    """One conversation bound to the engine and to one of its sequences."""

    engine: EngineClient
    conversation: Conversation
    sampling: SamplingParams
    sequence: int | None = None  # None: the engine picks
    use_cache: bool = True
    stops: tuple[str, ...] = ()

    def send(self, text: str, wording: TooLongWording) -> Reply:
        """Add a user message and start the answer; raise ChatappError if it cannot start."""
        if not text.strip():
            raise ChatappError("the message is empty; type something first")
        self.conversation.add_user(text)
        try:
            answers = AnswerStart(self.engine)
            plan = answers.plan(self.conversation.prompt_messages())
            started = answers.start(plan, self.sampling, wording, sequence=self.sequence, use_cache=self.use_cache)
        except BaseException:
            self.conversation.drop_last()
            raise
        return Reply(self, started.handle, self.stops)
