"""`chatapp cache verify`: the sampled prompts that reused cached KV, checked now against cold runs.

The engine checks a sample in idle time (cache/restore_checks.py); a process that ends right after
its answer (`chatapp ask`) leaves its sample waiting. This checks what waits: each prompt is answered
once with the cache (restoring what it reuses now) and once without it, and the next token's logits
compared bit for bit. Reuse is allowed for these runs even where a failed check stopped it, so that a
check can show it exact again; `--clear` resumes reuse without checking.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from cache.maintenance import CHECKS_FOLDER
from cache.restore_checks import RestoreChecks, ReusedPrompt
from chatapp.engine.contract import EngineClient, GenerationRequest, SamplingParams, build_name
from chatapp.errors import ChatappError
from chatapp.services.units import count_of

GREEDY_ONE = SamplingParams(temperature=0.0, max_tokens=1)  # only the logits after the prompt are compared


@dataclass
class VerifyReport:
    """What one `cache verify` run checked."""

    model: str
    checked: int = 0
    equal: int = 0
    by_tier: Counter[str] = field(default_factory=Counter)
    gone: int = 0  # sampled prompts the cache no longer reuses anything of (evicted, expired, cleared)
    lifetime_checked: int = 0
    lifetime_equal: int = 0
    stopped: bool = False

    def describe(self) -> str:
        lifetime = f"; {self.lifetime_equal:,} of {self.lifetime_checked:,} checked so far were equal"
        if not self.checked:
            gone = f" ({self.gone:,} no longer cached)" if self.gone else ""
            line = f"{self.model}: no sampled prompt waits to be checked{gone}{lifetime}"
        else:
            tiers = ", ".join(f"{tier} {count:,}" for tier, count in sorted(self.by_tier.items()))
            line = (
                f"{self.model}: checked {count_of(self.checked, 'prompt')} that reuse cached "
                f"KV ({tiers}): {self.equal:,} bit-identical to a cold run{lifetime}"
            )
        if self.stopped:
            found = "this run found a difference" if self.equal < self.checked else "a check found a difference"
            line += (
                f"\nreuse is stopped for this model and build ({found}): every prompt is computed in full until "
                "`chatapp cache verify --clear`"
            )
        return line


def verify(engine: EngineClient, model: str, limit: int = 0) -> VerifyReport:
    """Check the prompts waiting in `engine`'s cache (at most `limit`; 0: all) against cold runs."""
    cache = engine.cache
    if cache is None:
        raise ChatappError("there is no local KV cache to verify: the engine runs without one or on a server")
    checks = cache.checks
    build = build_name()
    report = VerifyReport(model)
    waiting = checks.take(build)  # ours now: the engine's own idle-time check finds none of them
    try:
        with checks.reuse_allowed():
            while waiting and (not limit or report.checked < limit):
                sampled = waiting[0]
                cached = engine.generate(GenerationRequest(sampled.tokens, GREEDY_ONE)).wait()
                stats = cached.stats
                if stats.reused_tokens:
                    cold = engine.generate(GenerationRequest(sampled.tokens, GREEDY_ONE, use_cache=False)).wait()
                    if not stats.logits_digest or not cold.stats.logits_digest:  # stopped before its logits
                        break
                    tier = stats.reuse_tier.value
                    now = ReusedPrompt(sampled.tokens, tier, stats.reused_tokens, stats.logits_digest, build)
                    report.checked += 1
                    report.by_tier[tier] += 1
                    report.equal += checks.done(now, cold.stats.logits_digest)
                else:
                    report.gone += 1
                waiting.pop(0)
    finally:
        checks.put_back(waiting)  # what was not checked (a limit, an interrupt) waits for the next time
    counts = checks.counts()
    report.lifetime_checked, report.lifetime_equal, report.stopped = counts.checked, counts.equal, counts.suspended
    return report


def resume_reuse(cache_dir: Path) -> int:
    """Clear the stop a failed check set, for every model in the folder; how many were stopped."""
    resumed = 0
    for record in sorted((cache_dir / CHECKS_FOLDER).glob("*.json")):
        checks = RestoreChecks(cache_dir, record.stem)
        if checks.suspended:
            if not checks.clear():
                raise ChatappError(f"could not write {record}: reuse stays stopped; fix the folder's permissions")
            resumed += 1
    return resumed
