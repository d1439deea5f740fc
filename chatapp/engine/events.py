"""What a generation reports while it runs and when it ends: one vocabulary from the engine to the screens."""

from __future__ import annotations

from dataclasses import dataclass

from chatapp.vocabulary import ReuseTier, StopReason


@dataclass(frozen=True)
class PromptProgress:
    """Prompt tokens computed so far (for a progress bar while a long prompt is read)."""

    done: int
    total: int


@dataclass(frozen=True)
class PromptReuse:
    """Where the prompt's beginning came from, known before any of the rest is computed (sent before
    any progress)."""

    reused_tokens: int
    prompt_tokens: int
    tier: ReuseTier


@dataclass(frozen=True)
class AnswerText:
    """New text of the answer (empty while a character is incomplete) and the token that made it.

    `token_id` is -1 for text released at the end without a new token (the services' stop strings).
    """

    text: str
    token_id: int


StreamEvent = PromptReuse | PromptProgress | AnswerText  # what a request reports while it runs


@dataclass(frozen=True)
class RestoreTimings:
    """Where a restore from the cache spent its time, in milliseconds (the bench's restore figure)."""

    lookup_ms: float  # finding the longest stored prefix
    read_ms: float  # the blocks from RAM, or from disk, copied into one state in llama.cpp's layout as they come
    load_ms: float  # llama.cpp taking that state (what loading a ready buffer costs)
    whole_state: bool = False  # a kept whole state, loaded and cut (nothing read)

    @property
    def total_ms(self) -> float:
        return self.lookup_ms + self.read_ms + self.load_ms


@dataclass(frozen=True)
class GenerationStats:
    """Per-request figures; `reused + computed == prompt_tokens`."""

    prompt_tokens: int
    reused_tokens: int
    computed_tokens: int
    reuse_tier: ReuseTier
    generated_tokens: int
    ttft_ms: float
    total_ms: float
    prefill_ms: float
    restore: RestoreTimings | None = None  # the steps of a restore from RAM or disk
    # The next token's logits after the prompt, hashed (NativeContext.logits_digest): a cold run of the same
    # prompt on the same build has the same digest exactly when its logits are bit-identical ("" if none).
    logits_digest: str = ""

    @property
    def decode_tokens_per_s(self) -> float:
        """Generated tokens per second after the first token."""
        seconds = (self.total_ms - self.ttft_ms) / 1000
        return (self.generated_tokens - 1) / seconds if self.generated_tokens > 1 and seconds > 0 else 0.0


@dataclass(frozen=True)
class GenerationResult:
    """The whole answer: text, the exact token ids (for append-only prompts) and statistics."""

    text: str
    token_ids: tuple[int, ...]
    stop_reason: StopReason
    stats: GenerationStats
