"""The cache as the user sees it: tiers, hit rate, pinned prefixes, prune and clear.

Pinning keeps a persona's or a document's prefix out of eviction and TTL expiry. The prefix
is computed and stored first if it is not in the cache yet, so a pin always holds blocks.
Pins a server's requests asked for are listed too, with their end, and ended when it passes.
These calls wait for the engine and the disk: run them off the UI thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cache.prefix_cache import PrefixCache
from chatapp.engine.contract import EngineClient, GenerationRequest, SamplingParams
from chatapp.errors import ChatappError
from chatapp.prompting.prompt import ChatMessage
from chatapp.records import PersonaRecord, PinRecord
from chatapp.services import cache_admin, cache_advice
from chatapp.services.branches import as_document
from chatapp.services.cache_advice import Advice
from chatapp.services.chat_service import ChatService
from chatapp.services.pins import PinKeeper
from chatapp.services.prompt_plan import builder_of
from chatapp.services.units import count_of
from chatapp.vocabulary import Role


@dataclass(frozen=True)
class CacheOverview:
    stats: Mapping[str, Any]
    live: bool  # figures of the running cache (else read from the folder)
    pins: list[PinRecord]
    ttft_ms: list[float]
    problem: str | None
    memory: str  # what reuse the model's memory allows
    divergence: str | None = None  # where this session's last prompt that left an earlier one did
    restore_choice: str | None = None  # this session's hits restored or computed, and the speeds behind it
    server: str | None = None  # the backend whose own cache serves this session (no local tiers, pins or actions)
    checks: str | None = None  # the restore checks' outcome (cache/restore_checks.py)


class CacheService:
    def __init__(self, chat: ChatService) -> None:
        self.chat = chat

    def overview(self) -> CacheOverview:
        engine = self.chat.slot.engine
        pins = self.chat.pins.list() if self.chat.pins else []
        problem = engine.cache_problem if engine is not None else None
        interval = cache_admin.checkpoint_interval(self.chat.workspace)
        last = self.chat.figures.last_divergence
        divergence = last.describe() if last is not None else None
        if engine is not None and engine.info.server is not None:
            return self._server_overview(engine.info.server, divergence)
        if engine is not None and engine.cache is not None:
            if self.chat.pins is not None:
                PinKeeper(engine.cache, self.chat.pins).sweep()  # pins a request asked for, whose time is up
                pins = self.chat.pins.list()
            stats = engine.cache.stats()
            kind, window = stats["memory"]["kind"], stats["memory"]["window"]
            memory = cache_admin.describe_memory(kind, window, interval, engine.info.prompt_grid, engine.info.kv_type)
            if count := stats["memory"]["checkpoints"]:
                memory += f" ({count_of(count, 'checkpoint')} stored)"
            choice = engine.restore_costs.describe() if engine.restore_costs is not None else None
            ttft = list(self.chat.figures.ttft_ms)
            checks = cache_admin.describe_checks(stats.get("checks"))
            return CacheOverview(stats, True, pins, ttft, problem, memory, divergence, choice, checks=checks)
        offline = cache_admin.cache_stats(self.chat.workspace)
        return CacheOverview(
            offline,
            False,
            pins,
            list(self.chat.figures.ttft_ms),
            problem,
            offline["memory"]["description"],
            divergence,
            checks=cache_admin.describe_checks(offline["checks"]),
        )

    def advice(self) -> Advice | None:
        """What other budgets would have reused of this folder's logged requests (None: none logged yet)."""
        workspace = self.chat.workspace
        engine = self.chat.slot.engine
        if engine is not None and engine.cache is not None:
            engine.cache.flush()  # the stores of the last answer, logged by the cache's writer
        return cache_advice.advise(workspace.kv_cache_dir, workspace.settings)

    def _server_overview(self, server: str, divergence: str | None) -> CacheOverview:
        """A backend's cache: only what its answers reported (tokens it reused), nothing to administer here."""
        figures = self.chat.figures
        prompt = figures.prompt_tokens
        stats = {
            "requests": len(figures.ttft_ms),
            "prompt_tokens": prompt,
            "reused_tokens": figures.reused_tokens,
            "hit_rate": figures.reused_tokens / prompt if prompt else 0.0,
        }
        memory = (
            f"the cache is the server's at {server}; these figures are what its answers reported "
            "(prompt tokens it reused). Pins, prune and clear apply to a cache on this machine only."
        )
        if figures.unreported:
            memory += (
                f" {figures.unreported:,} of this session's answers came without a figure: the server does not say."
            )
        return CacheOverview(stats, True, [], list(figures.ttft_ms), None, memory, divergence, server=server)

    def pin_persona(self, persona: PersonaRecord) -> int:
        return self._pin_persona_prompt(persona.name, persona.prompt)

    def pin_open_persona(self) -> int:
        """The open branch's persona, as every conversation with it begins."""
        root = self.chat.current.view().root
        if not root.content:
            raise ChatappError("this branch has no persona to pin; pick one with F2")
        return self._pin_persona_prompt(root.persona_name or "custom persona", root.content)

    def _pin_persona_prompt(self, name: str, prompt: str) -> int:
        builder = builder_of(self._engine())
        tokens = builder.build([ChatMessage.of(Role.SYSTEM, prompt)], add_generation_prompt=False)
        return self._pin("persona", name, tokens)

    def pin_document(self) -> int:
        """The open branch's persona and document, as every question about it begins."""
        view = self.chat.current.view()
        if view.document is None:
            raise ChatappError("this branch has no document; attach one first (Ctrl+O)")
        tokens = self.chat.next_question_tokens(view.root, as_document(view.document), [], "")
        label = f"{view.document.name} (persona: {view.persona_name or 'none'})"
        return self._pin("document", label, tokens)

    def unpin(self, pin: PinRecord) -> int:
        """End `pin`; what other pins hold stays pinned."""
        return self._keeper().unpin(pin)

    def prune(self) -> int:
        return self._cache().prune()

    def clear(self) -> int:
        """Empty the RAM and disk tiers (pins included); what is live in the context stays."""
        removed = self._cache().clear()
        if self.chat.pins is not None:
            self.chat.pins.clear()
        return removed

    def _pin(self, kind: str, label: str, tokens: list[int]) -> int:
        engine = self._engine()
        keeper = self._keeper()  # before computing anything: the cache may be off
        handle = engine.generate(
            GenerationRequest(prompt_tokens=tuple(tokens), sampling=SamplingParams(), prefill_only=True, store=True)
        )
        handle.wait()
        engine.flush_cache()
        count = keeper.pin(kind, label, tokens)
        if count == 0:
            raise ChatappError("nothing to pin: the prefix could not be stored (is the cache full or disabled?)")
        return count

    def _keeper(self) -> PinKeeper:
        if self.chat.pins is None:
            raise ChatappError("pins need the conversations database, which is not open in this session")
        return PinKeeper(self._cache(), self.chat.pins)

    def _engine(self) -> EngineClient:
        if self.chat.slot.engine is None:
            raise ChatappError("the model is still loading; try again in a moment")
        return self.chat.slot.engine

    def _cache(self) -> PrefixCache:
        engine = self._engine()
        if engine.info.server is not None:
            raise ChatappError(f"the cache is the server's at {engine.info.server}; manage it there")
        if engine.cache is None:
            raise ChatappError(engine.cache_problem or "the KV cache is off in this session")
        return engine.cache
