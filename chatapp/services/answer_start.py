"""The one door every answer goes through on an engine: ask, the chat screen (ask and regenerate),
the APIs (every protocol) and the bench.

It owns what each of them did in its own way before: the prompt planned for the engine, the
check that it fits (worded by the caller), the warm-up told what the answer needs (so it stops
warming anything else), and the log of earlier prompts that says where this one left them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chatapp.engine.contract import EngineClient, GenerationHandle, GenerationRequest, SamplingParams
from chatapp.errors import ContextOverflowError
from chatapp.prompting.planner import PromptPlan
from chatapp.prompting.prompt import ChatMessage, PromptBuilder
from chatapp.services.divergence import Divergence, PromptLog
from chatapp.services.prompt_plan import TooLongWording, check_fits, plan_for, prompt_too_long
from chatapp.services.warmup import Prewarmer


@dataclass(frozen=True)
class StartedAnswer:
    """An answer queued on the engine, and where its prompt left the closest earlier one (None: it
    goes on from one, or shares nothing)."""

    handle: GenerationHandle
    divergence: Divergence | None


class AnswerStart:
    """Starts answers on one engine; safe to call from any thread."""

    def __init__(self, engine: EngineClient, prewarmer: Prewarmer | None = None) -> None:
        self.engine = engine
        self.prewarmer = prewarmer  # None where nothing warms ahead (the APIs, ask, the bench)
        self.prompts = PromptLog(engine.prompt_builder)

    def plan(
        self, messages: Sequence[ChatMessage], builder: PromptBuilder | None = None, keep_through: Sequence[int] = ()
    ) -> PromptPlan:
        """The prompt of `messages` for this engine (`builder`: the engine's own, or one offering tools;
        `keep_through`: the beginnings the request asks to keep, as counts of messages)."""
        return plan_for(self.engine, messages, builder, keep_through)

    def start(
        self,
        plan: PromptPlan,
        sampling: SamplingParams,
        wording: TooLongWording,
        *,
        sequence: int | None = None,
        use_cache: bool = True,
    ) -> StartedAnswer:
        """Queue the answer to `plan`: PromptTooLongError (in `wording`) when it does not fit, and the
        engine's refusals (GrammarError) as they come; a refused prompt is not logged."""
        if self.prewarmer is not None:
            self.prewarmer.before_send(plan.tokens)
        check_fits(self.engine, len(plan.tokens), wording)
        request = GenerationRequest(
            plan.tokens,
            sampling,
            sequence=sequence,
            use_cache=use_cache,
            checkpoints=plan.checkpoints,
            messages=plan.messages,
            turn_ends=plan.turn_ends,
        )
        try:
            handle = self.engine.generate(request)
        except ContextOverflowError as error:  # the engine knew a smaller limit (a server's own)
            raise prompt_too_long(error.prompt_tokens, error.context_tokens, wording) from None
        return StartedAnswer(handle, self.prompts.compare(list(plan.tokens)))
