"""The bench's figures that are not peers side by side: lookup (L), storage (S), restores (R), prefill (P),
streams (N) and traces (G), measured after the workloads, then recorded, judged and printed together."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatapp.benchmark.cache_figures import (
    LookupFigures,
    StorageByType,
    StorageWork,
    cache_figure_verdicts,
    figures_record,
    figures_table,
    measure_lookup,
    measure_storage_by_type,
)
from chatapp.benchmark.goals import Verdict
from chatapp.benchmark.large_state_figure import (
    LARGE_NAME,
    LARGE_PREFIX_TOKENS,
    LargeStateFigures,
    large_state_figure_verdicts,
    large_state_record,
    large_state_table,
    measure_large_state,
)
from chatapp.benchmark.peers import PeerSettings
from chatapp.benchmark.prefill_figure import (
    PREFILL_NAME,
    PrefillFigures,
    measure_prefill,
    prefill_figure_verdicts,
    prefill_record,
    prefill_table,
)
from chatapp.benchmark.restore_figure import (
    RESTORE_NAME,
    RestoreFigures,
    measure_restores,
    restore_figure_verdicts,
    restore_record,
    restore_table,
)
from chatapp.benchmark.streams_figure import (
    STREAMS_NAME,
    StreamsFigures,
    measure_streams,
    streams_figure_verdicts,
    streams_record,
    streams_table,
)
from chatapp.benchmark.trace_figure import (
    TRACE_NAME,
    TraceFigures,
    measure_traces,
    trace_figure_verdicts,
    trace_record,
    trace_table,
)
from chatapp.benchmark.workloads import PromptKit, Scale

KIT_FIGURES = {"S", RESTORE_NAME, PREFILL_NAME, STREAMS_NAME, LARGE_NAME}  # built from prompts as the app builds them


@dataclass(frozen=True)
class FigureJob:
    """What every figure is measured with."""

    scale: Scale
    settings: PeerSettings
    server: Path | None  # llama-server, the yardstick of P and N (None: not built)
    work: Path  # a folder for the figures' caches
    max_tokens: int
    log: Callable[[str], None]


@dataclass
class FigureRuns:
    """What each figure measured (None: not asked for, or not yet)."""

    lookup: LookupFigures | None = None
    storage: StorageByType | None = None
    restores: RestoreFigures | None = None
    large: LargeStateFigures | None = None
    prefills: PrefillFigures | None = None
    streams: StreamsFigures | None = None
    traces: TraceFigures | None = None

    def measure(self, names: tuple[str, ...], job: FigureJob) -> None:
        """Measure the figures `names` asks for, one after another."""
        if "L" in names:
            job.log(f"L: lookup among {job.scale.lookup_conversations:,} conversations")
            self.lookup = measure_lookup(job.scale.lookup_conversations)
        if KIT_FIGURES & set(names):
            kit = PromptKit(job.settings.model_path)  # one vocabulary for the figures that build prompts
            try:
                self._measure_with_prompts(kit, names, job)
            finally:
                kit.close()
        if TRACE_NAME in names:
            job.log(f"{TRACE_NAME}: eviction policies replayed on request traces")
            self.traces = measure_traces(job.scale.trace_scale)

    def _measure_with_prompts(self, kit: PromptKit, names: tuple[str, ...], job: FigureJob) -> None:
        scale, settings, work = job.scale, job.settings, job.work
        if "S" in names:
            job.log(f"S: storage of {scale.storage_conversations} conversations on one persona, in each KV type")
            asked = StorageWork(scale.storage_conversations, scale.system, scale.question, job.max_tokens)
            self.storage = measure_storage_by_type(settings, kit, work / "storage", asked)
        if RESTORE_NAME in names:
            job.log(f"{RESTORE_NAME}: restoring one {scale.system:,}-token prefix by each path, and total misses")
            self.restores = measure_restores(
                settings,
                kit,
                work / "restores",
                prefix_tokens=scale.system,
                repeats=scale.restore_repeats,
                miss_repeats=scale.miss_repeats,
            )
        if LARGE_NAME in names:
            job.log(f"{LARGE_NAME}: one {LARGE_PREFIX_TOKENS:,}-token prefix stored and restored, memory and time")
            self.large = measure_large_state(settings, kit, work / "large")
        if PREFILL_NAME in names:
            job.log(
                f"{PREFILL_NAME}: prefill with nothing cached, chatapp and llama-server, flash attention off and on"
            )
            self.prefills = measure_prefill(
                settings, kit, job.server, prompt_tokens=scale.system, repeats=scale.restore_repeats
            )
        if STREAMS_NAME in names:
            counts = ", ".join(map(str, scale.stream_clients))
            job.log(f"{STREAMS_NAME}: {counts} clients at once, chatapp serve and llama-server -np N")
            self.streams = measure_streams(
                settings,
                kit,
                job.server,
                work / "streams",
                clients=scale.stream_clients,
                rounds=scale.stream_rounds,
                answer_tokens=scale.stream_answer,
                prompt_context=scale.system,
                log=job.log,
            )

    def record(self) -> dict[str, Any]:
        """The figures for bench.json."""
        return {
            **figures_record(self.lookup, self.storage),
            **({"traces": trace_record(self.traces)} if self.traces is not None else {}),
            **({"restores": restore_record(self.restores)} if self.restores is not None else {}),
            **({"large_state": large_state_record(self.large)} if self.large is not None else {}),
            **({"prefill": prefill_record(self.prefills)} if self.prefills is not None else {}),
            **({"streams": streams_record(self.streams)} if self.streams is not None else {}),
        }

    def verdicts(self) -> list[Verdict]:
        """The goals these figures are judged by."""
        return [
            *cache_figure_verdicts(self.lookup, self.storage),
            *restore_figure_verdicts(self.restores),
            *large_state_figure_verdicts(self.large),
            *prefill_figure_verdicts(self.prefills),
            *streams_figure_verdicts(self.streams),
            *trace_figure_verdicts(self.traces),
        ]

    def tables(self) -> list[str]:
        """A printed table per figure measured, in the order they are printed."""
        found = self.lookup is not None or self.storage is not None
        tables = [figures_table(self.lookup, self.storage)] if found else []
        if self.restores is not None:
            tables.append(restore_table(self.restores))
        if self.large is not None:
            tables.append(large_state_table(self.large))
        if self.prefills is not None:
            tables.append(prefill_table(self.prefills))
        if self.streams is not None:
            tables.append(streams_table(self.streams))
        if self.traces is not None:
            tables.append(trace_table(self.traces))
        return tables
