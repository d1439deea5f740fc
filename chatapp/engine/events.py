"""What a generation reports while it runs and when it ends."""

from __future__ import annotations

from dataclasses import dataclass

from chatapp.vocabulary import ReuseTier, StopReason


@dataclass(frozen=True)
class PrefillProgress:
    """Prompt tokens evaluated so far, for a progress bar on long prompts."""

    done: int
    total: int


@dataclass(frozen=True)
class PromptPlaced:
    """The prompt found its sequence: how much of it is reused, and from where (sent before any progress)."""

    reused_tokens: int
    prompt_tokens: int
    tier: ReuseTier


@dataclass(frozen=True)
class TokenText:
    """New answer text (may be empty while a UTF-8 character is incomplete) and its token id."""

    text: str
    token_id: int


@dataclass(frozen=True)
class RestoreTimings:
    """Where a restore from the cache spent its time, in milliseconds (the bench's restore figure)."""

    lookup_ms: float  # finding the longest stored prefix
    read_ms: float  # the payloads from RAM, or from disk
    assemble_ms: float  # one state in llama.cpp's layout
    load_ms: float  # llama.cpp taking that state (what loading a ready buffer costs)
    whole_state: bool = False  # a kept whole state, loaded and cut (no read, no assembly)

    @property
    def total_ms(self) -> float:
        return self.lookup_ms + self.read_ms + self.assemble_ms + self.load_ms


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
