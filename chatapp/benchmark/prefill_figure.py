"""Figure P: prompt tokens per second, chatapp's engine beside llama-server, flash attention off and on;
and one stream's answer tokens per second (the decode row), the same two side by side.

Each side computes novel prompts of the A persona's length with nothing cached (chatapp:
`use_cache` off; llama-server: `--cache-ram 0` and a new prompt each time), in the same
model, context and threads; the speed is prompt tokens over the time to the first token.
chatapp's flash-attention mode makes every batch 64 tokens or more (batching.py), which keeps
its restores exact; llama-server's default is flash attention on where the device has it.
The decode row is answer tokens after the first over the time after the first (each side's own
count: a greedy answer to a question that asks for a long one), flash attention off and on; its goal is
judged with it off in both. Both sides are open together for each setting and asked in turns, request
by request, prompts and answers alike: a run's drifting load then falls on both. Which setting is
faster depends on the CPU's kernels and varies from one day to the next on a shared machine (on one
Xeon, chatapp's prefill with flash attention on was 1.32x as fast with AVX2 kernels, 0.96x and 1.13x
on two days with AVX-512 ones): the table tells a user whether `flash_attention = true` pays on their
machine and model in this run.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Sequence
from contextlib import closing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chatapp.benchmark.goals import Verdict, decode_verdict, prefill_verdicts
from chatapp.benchmark.llama_server import uncached_server
from chatapp.benchmark.peers import Peer, PeerAnswer, PeerSettings
from chatapp.benchmark.workloads import PromptKit, Request
from chatapp.engine.contract import GenerationRequest, SamplingParams
from chatapp.engine.opening import FLASH_ATTENTION_ROWS, EngineConfig, flash_pays, start_local_engine
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import Role

PREFILL_NAME = "P"
DECODE_TOKENS = 128  # answer tokens per decode measurement
DECODE_QUESTION = "Write a long story about a lighthouse keeper and the sea."


@dataclass(frozen=True)
class PrefillFigures:
    prompt_tokens: int
    repeats: int
    tokens_per_s: dict[str, float]  # "chatapp" / "llama-server", each with " flash" for flash attention on
    elapsed_s: float
    decode_tokens_per_s: dict[str, float] = field(default_factory=dict)  # named as tokens_per_s


def measure_prefill(
    settings: PeerSettings, kit: PromptKit, server: Path | None, *, prompt_tokens: int, repeats: int
) -> PrefillFigures:
    """Median prompt tokens per second of each side and flash-attention setting (llama-server if built)."""
    started = time.perf_counter()
    prompts = [
        kit.build(
            [
                ChatMessage.of(Role.SYSTEM, kit.texts.persona(900 + number, prompt_tokens)),
                ChatMessage.of(Role.USER, "?"),
            ]
        )
        for number in range(2 * repeats)
    ]
    question = kit.build([ChatMessage.of(Role.USER, DECODE_QUESTION)])
    speeds: dict[str, float] = {}
    decode: dict[str, float] = {}
    for flash in (False, True):
        suffix = " flash" if flash else ""
        measured = _side_by_side(settings, server, prompts, question, flash)
        for side, (prefill, decoding) in measured.items():
            speeds[f"{side}{suffix}"], decode[f"{side}{suffix}"] = prefill, decoding
    return PrefillFigures(len(prompts[0]), repeats, speeds, time.perf_counter() - started, decode)


def _after_first(tokens: int, ttft_ms: float, total_ms: float) -> float:
    """Answer tokens per second after the first token (0 when the answer had one token or none)."""
    seconds = (total_ms - ttft_ms) / 1000
    return (tokens - 1) / seconds if tokens > 1 and seconds > 0 else 0.0


def _engine_config(settings: PeerSettings, flash: bool) -> EngineConfig:
    return EngineConfig(
        model_path=settings.model_path,
        context_cap=settings.context,
        sequences=1,
        n_gpu_layers=settings.gpu_layers,
        threads=settings.threads,
        n_batch=settings.n_batch,
        flash_attention=flash,
    )


class _UncachedChatapp:
    """chatapp's engine as a bench peer (peers.Peer), every prompt computed whole (`use_cache` off).

    `settle` waits until the engine is idle: after an answer it computes the answer's tokens again in prompt
    batches (128 tokens: about a third of a second on both cores here), which would otherwise run during
    llama-server's turn and slow it (measured: 74-80 against 100-125 tokens/s)."""

    name = "chatapp"

    def __init__(self, settings: PeerSettings, flash: bool) -> None:
        self.engine = start_local_engine(_engine_config(settings, flash))

    def prepare(self, request: Request) -> dict[str, float] | None:
        return None

    def ask(self, prompt_tokens: Sequence[int], max_tokens: int) -> PeerAnswer:
        sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        result = self.engine.generate(GenerationRequest(tuple(prompt_tokens), sampling, use_cache=False)).wait()
        stats = result.stats
        return PeerAnswer(
            result.text, result.token_ids, stats.ttft_ms, stats.total_ms, stats.prompt_tokens, stats.computed_tokens
        )

    def settle(self) -> None:
        self.engine.flush_cache()

    def close(self) -> None:
        self.engine.close()


def _asked(peer: Peer, prompt: tuple[int, ...], max_tokens: int) -> PeerAnswer:
    """One greedy answer, then the peer's own work after it (off the clock): the other side's turn is its own."""
    answer = peer.ask(prompt, max_tokens)
    peer.settle()
    return answer


def _side_by_side(
    settings: PeerSettings, server: Path | None, prompts: list[tuple[int, ...]], question: tuple[int, ...], flash: bool
) -> dict[str, tuple[float, float]]:
    """Each side's median prefill speed (each its own half of `prompts`) and median decode speed, one engine and
    one llama-server (when built) open together and asked in turns, request by request: the machine's load
    drifts within a run as much as the gap the decode goal judges."""
    repeats = len(prompts) // 2
    with contextlib.ExitStack() as stack:
        sides: dict[str, Peer] = {"chatapp": stack.enter_context(closing(_UncachedChatapp(settings, flash)))}
        if server is not None:
            sides["llama-server"] = stack.enter_context(
                closing(uncached_server(settings, server, flash_attention=flash))
            )
        prefill: dict[str, list[float]] = {name: [] for name in sides}
        decode: dict[str, list[float]] = {name: [] for name in sides}
        for repeat in range(repeats):
            for number, (name, peer) in enumerate(sides.items()):
                prompt = prompts[number * repeats + repeat]
                prefill[name].append(len(prompt) / (_asked(peer, prompt, 1).ttft_ms / 1000))
        for _ in range(repeats):
            for name, peer in sides.items():
                answer = _asked(peer, question, DECODE_TOKENS)
                tokens = len(answer.token_ids) if answer.token_ids is not None else DECODE_TOKENS
                decode[name].append(_after_first(tokens, answer.ttft_ms, answer.total_ms))
    return {name: (statistics.median(prefill[name]), statistics.median(decode[name])) for name in sides}


def flash_advice(figures: PrefillFigures) -> str:
    """Whether flash attention pays for chatapp on this machine and model: its prefill and decode speed on
    against off, and what turning it on costs (empty where this run did not measure both)."""
    gains = _flash_gains(figures)
    if gains is None:
        return ""
    return (
        f"chatapp with flash attention on: prefill {gains[0]:.2f}x, decode {gains[1]:.2f}x its speed off in this run "
        f"(by the rule `auto` measures with at load: {'on' if flash_pays(*gains) else 'off'} for the TUI and ask, "
        f"off in a server whose clients' answers batch; on, each answer computes its last {FLASH_ATTENTION_ROWS} "
        "prompt tokens again, and several clients' answers are decoded one at a time)"
    )


def _flash_gains(figures: PrefillFigures) -> tuple[float, float] | None:
    """chatapp's prefill and decode speed with flash attention on / off (None: not both measured)."""
    prefill, decoding = figures.tokens_per_s, figures.decode_tokens_per_s
    sides = ("chatapp", "chatapp flash")
    if not all(prefill.get(side) for side in sides) or not all(decoding.get(side) for side in sides):
        return None
    return prefill["chatapp flash"] / prefill["chatapp"], decoding["chatapp flash"] / decoding["chatapp"]


def _chatapp_default(figures: PrefillFigures) -> str:
    """The side that is chatapp's default for one user: `auto`'s rule applied to this run's speeds."""
    gains = _flash_gains(figures)
    return "chatapp flash" if gains is not None and flash_pays(*gains) else "chatapp"


def prefill_figure_verdicts(figures: PrefillFigures | None) -> list[Verdict]:
    if figures is None or "llama-server flash" not in figures.tokens_per_s:
        return []
    speeds, decode = figures.tokens_per_s, figures.decode_tokens_per_s
    default = _chatapp_default(figures)
    verdicts = prefill_verdicts(
        default=speeds[default] / speeds["llama-server flash"],
        flash=speeds["chatapp flash"] / speeds["llama-server flash"],
    )
    if decode.get("llama-server flash") and decode.get(default):
        verdicts.append(decode_verdict(decode[default] / decode["llama-server flash"]))
    return verdicts


def prefill_record(figures: PrefillFigures) -> dict[str, Any]:
    """For bench.json."""
    return asdict(figures)


def prefill_table(figures: PrefillFigures) -> str:
    speeds = figures.tokens_per_s
    cells = "  ".join(f"{name} {speed:,.0f}" for name, speed in speeds.items())
    decoding = figures.decode_tokens_per_s
    decode = "  ".join(f"{name} {speed:,.1f}" for name, speed in decoding.items())
    lines = [
        f"P  prefill of a {figures.prompt_tokens:,}-token prompt, nothing cached (median of {figures.repeats}, "
        f"tokens/s; {figures.elapsed_s:.0f} s): {cells}",
        f"P  decode of one stream, answer tokens/s after the first (median of {figures.repeats}): {decode}",
    ]
    advice = flash_advice(figures)
    if advice:
        lines.append(f"   {advice}")
    return "\n".join(lines)
