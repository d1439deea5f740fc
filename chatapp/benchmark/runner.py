"""`chatapp bench`: every peer over every workload, side by side, in one process.

Workloads run one after another, and on each the peers one after another (so the figures
compared are taken close in time), each on a fresh instance in a fresh folder (workload E
closes it part-way and opens a new instance on the same folder: a restart). Each instance is
closed before the next one starts. Per request: TTFT, computed prompt tokens and the answer
text. At temperature 0 every peer must give the same text for each request as the first
peer (no-cache by default); otherwise the run fails loudly (exit status 2) unless
`--allow-mismatch`.

Peak RSS is measured in this process by a thread sampling VmRSS from /proc/self/status every
10 ms while a peer runs (VmHWM cannot be reset between peers); for a server the bench starts
(llama-server, chatapp serve), the server process's own peak is added. Memory a previous peer
freed but the allocator kept shows up in later peers' figures too: `start_rss_bytes` says how
much was there before each peer.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import llama_cpp

from chatapp.benchmark.anthropic_client import answer_as_shown, anthropic_body
from chatapp.benchmark.cache_figures import FIGURE_NAMES
from chatapp.benchmark.figure_runs import FigureJob, FigureRuns
from chatapp.benchmark.goals import goals_table, reused_fraction
from chatapp.benchmark.large_state_figure import LARGE_NAME
from chatapp.benchmark.memory import RssSampler, folder_bytes
from chatapp.benchmark.peers import PEERS, Peer, PeerFactory, PeerSettings, open_cold_engine
from chatapp.benchmark.prefill_figure import PREFILL_NAME
from chatapp.benchmark.remote_peer import (
    ENV_BACKEND_KEY,
    LOOPBACK_PEER,
    PeerSpecError,
    RemotePeerFactory,
    remote_peer_factory,
)
from chatapp.benchmark.report import MIB, reuse_table, table, write_reports
from chatapp.benchmark.restore_figure import RESTORE_NAME
from chatapp.benchmark.streams_figure import STREAMS_NAME
from chatapp.benchmark.trace_figure import TRACE_NAME
from chatapp.benchmark.workloads import (
    AGENT_NAMES,
    SCALES,
    WORKLOAD_NAMES,
    Request,
    Scale,
    Workload,
    build_workloads,
)
from chatapp.engine.contract import GenerationRequest, SamplingParams
from chatapp.engine.opening import default_thread_count
from chatapp.errors import ChatappError
from chatapp.models.machine import resolve_model
from chatapp.prompting.planner import PromptPlanner
from chatapp.prompting.prompt import PromptBuilder
from chatapp.services.answer_run import AnswerRun
from chatapp.services.answer_shape import AnswerShape, ToolChoice
from chatapp.services.prompt_plan import builder_of

SERVER_PEER = "llama-server"
SERVE_PEER = "chatapp-serve"
MESSAGES_PEERS = (SERVE_PEER, SERVER_PEER)  # the peers that serve Anthropic's Messages API (K, J)
DEFAULT_PEERS = (*PEERS, SERVE_PEER, LOOPBACK_PEER)
ALL_NAMES = (*WORKLOAD_NAMES, *AGENT_NAMES, *FIGURE_NAMES, RESTORE_NAME, PREFILL_NAME, STREAMS_NAME, TRACE_NAME)
OPT_IN_NAMES = (LARGE_NAME,)  # only when named: W wants a model with wide KV (tools/wide_model.py)
SKIP_SERVER = "llama-server: skipped (not built; run tools/build_llama_server.py or pass --llama-server PATH)"


NOTES = """\
ideal: not a cache but the yardstick: before each request, the longest prefix any cache could know (shared with an
  earlier request, or the persona and document) is made live off the clock. chatapp+warm: the app's warm-ahead of the
  persona and document before the question; chatapp+typed: also the question computed as it is typed at 5 chars/s.
TTFT: Llama peers, create_completion to the first streamed chunk; chatapp, submission to the first token; servers
  (chatapp-serve, llama-server; chatapp-remote and remote:URL through chatapp's remote engine), sending the request
  to the first streamed text. B and D send requests back to back (throughput); between the others' requests every
  peer finishes its post-answer work off the clock, as while a user reads (wall time includes it)."""


def run_peer_on_workload(
    name: str,
    factory: PeerFactory,
    settings: PeerSettings,
    workload: Workload,
    folder: Path,
    max_tokens: int,
    log: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """One fresh peer instance (two for a restart workload) over one workload; the raw result.

    A workload of several clients (F) runs each client's requests in order on a thread of its
    own, all at once; a peer that cannot serve two requests at once gets them one at a time
    (its `prepare` and `ask` together), and a request's wait for its turn counts in its TTFT,
    as a client sees it, less the time another request was prepared off the clock. `served_s`
    is the time spent serving, restarts left out.
    """
    folder.mkdir(parents=True, exist_ok=True)
    restart_note: str | None = getattr(factory, "restart_note", None)  # a server the bench cannot restart
    records: dict[int, dict[str, Any]] = {}
    extra_peak = 0
    served_s = 0.0
    restart = workload.restart_before
    indexed = list(enumerate(workload.requests))
    phases = [indexed] if restart is None else [indexed[:restart], indexed[restart:]]
    with RssSampler() as rss:
        started = time.perf_counter()
        peer: Peer = factory(settings, folder)
        try:
            for number, phase in enumerate(phases):
                if number > 0:
                    extra_peak = max(extra_peak, _server_peak(peer))
                    peer.close()
                    log(f"{name} {workload.name}: {restart_note or 'restart'}")
                    peer = factory(settings, folder)
                phase_started = time.perf_counter()
                served = _PhaseRunner(peer, name, workload, max_tokens, log).run(phase)
                served_s += time.perf_counter() - phase_started
                records.update(served)
        finally:
            extra_peak = max(extra_peak, _server_peak(peer))
            peer.close()
        wall_s = time.perf_counter() - started
    return {
        "peer": name,
        "workload": workload.name,
        "wall_s": wall_s,
        "served_s": served_s,
        "clients": workload.clients,
        "context": settings.context,
        "start_rss_bytes": rss.start_bytes,
        "peak_rss_bytes": rss.peak_bytes + extra_peak,
        "disk_bytes": folder_bytes(folder),
        "requests": [records[index] for index in sorted(records)],
        **({"restart": restart_note} if restart_note and restart is not None else {}),
    }


@dataclass
class _PhaseRunner:
    """The requests of one peer instance: in order, or each client's in order, all clients at once."""

    peer: Peer
    name: str
    workload: Workload
    max_tokens: int
    log: Callable[[str], None]

    def run(self, phase: list[tuple[int, Request]]) -> dict[int, dict[str, Any]]:
        if self.workload.clients <= 1:
            return dict(self._serve(index, request) for index, request in phase)
        together = getattr(self.peer, "serves_together", False)
        lock: AbstractContextManager[object] = contextlib.nullcontext() if together else threading.Lock()
        queues = [[item for item in phase if item[1].client == client] for client in range(self.workload.clients)]

        off_clock: list[tuple[float, float]] = []  # when a serialized peer prepared (others wait off the clock)

        def client_loop(queue: list[tuple[int, Request]]) -> list[tuple[int, dict[str, Any]]]:
            served = []
            for index, request in queue:
                sent = time.perf_counter()
                with lock:  # a peer serving one request at a time: the wait is part of the client's latency
                    started = time.perf_counter()
                    # ...except while another client's request was prepared off the clock (the ideal's prefix)
                    paused = sum(max(0.0, min(end, started) - max(begin, sent)) for begin, end in off_clock)
                    served.append(self._serve(index, request, (started - sent - paused) * 1000, off_clock))
            return served

        with ThreadPoolExecutor(len(queues)) as pool:
            results = list(pool.map(client_loop, queues))
        return dict(item for served in results for item in served)

    def _serve(
        self, index: int, request: Request, queued_ms: float = 0.0, off_clock: list[tuple[float, float]] | None = None
    ) -> tuple[int, dict[str, Any]]:
        peer, workload = self.peer, self.workload
        preparing = time.perf_counter()
        prepared = peer.prepare(request)
        if off_clock is not None:
            off_clock.append((preparing, time.perf_counter()))
        if workload.protocol == "anthropic":  # K, J: the request as Claude Code sends it
            answer = peer.ask_messages(anthropic_body(request, self.max_tokens))  # type: ignore[attr-defined]
        else:
            answer = peer.ask(request.tokens, self.max_tokens)
        settle_started = time.perf_counter()
        if not workload.back_to_back:
            peer.settle()
        settle_ms = (time.perf_counter() - settle_started) * 1000
        self.log(
            f"{self.name} {workload.name} {index + 1}/{len(workload.requests)} "
            f"{request.label}: ttft {answer.ttft_ms:.0f} ms, "
            f"computed {answer.computed_tokens}/{answer.prompt_tokens}"
        )
        record = {
            "label": request.label,
            "client": request.client,
            "ttft_ms": queued_ms + answer.ttft_ms,
            "total_ms": queued_ms + answer.total_ms,
            "queued_ms": queued_ms,
            "settle_ms": settle_ms,
            "prompt_tokens": answer.prompt_tokens,
            "computed_tokens": answer.computed_tokens,
            "text": answer.text,
            "token_ids": list(answer.token_ids) if answer.token_ids is not None else None,
            "after_restart": workload.restart_before is not None and index >= workload.restart_before,
            "known_prefix": request.known_prefix,
            **({"prepare": prepared} if prepared else {}),
        }
        return index, {**record, "reused_fraction": reused_fraction(record)}


def cold_check(
    settings: PeerSettings, workload: Workload, run: dict[str, Any], max_tokens: int, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """The answers a workload over the Messages API names (`cold_checked`: K's first after the restart, restored
    from disk, and its last; J's first reusing conversation and its last) against the same prompts computed cold
    by chatapp's engine in this process (no cache; greedy, the answer's length fixed), and the prompt the server
    built from the messages against the one the workload built."""
    checks = []
    engine = open_cold_engine(settings)
    try:
        for index in workload.cold_checked:
            request, served = workload.requests[index], run["requests"][index]
            # The tools offered as the server offers them (auto: a lazy grammar from a call's first word on).
            builder = builder_of(engine).with_tools(request.tools)
            shape = AnswerShape(tools=request.tools, choice=ToolChoice.AUTO)
            sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, grammar=shape.grammar(builder))
            # Batches end where the server's did: at its checkpoints, cache_control's ends among them.
            checkpoints = tuple(sorted({*request.boundaries, *kept_ends(builder, request)}))
            cold_request = GenerationRequest(
                request.tokens,
                sampling,
                use_cache=False,
                checkpoints=checkpoints,
                turn_ends=builder.template.turn_ends,  # as the server's answer ends (a template-less model)
            )
            cold_run = AnswerRun(engine.generate(cold_request))  # the server's answers run through one too
            cold_run.wait()
            assert cold_run.ended is not None
            cold = answer_as_shown(cold_run.ended.text, shape, builder)
            same = cold == served["text"] and served["prompt_tokens"] == len(request.tokens)
            log(f"{workload.name} {request.label}: {'equal to' if same else 'UNLIKE'} the same prompt computed cold")
            checks.append({"label": request.label, "equal": same, "cold": cold, "served": served["text"]})
    finally:
        engine.close()
    return checks


def kept_ends(builder: PromptBuilder, request: Request) -> tuple[int, ...]:
    """Where K's `cache_control` breakpoints end the prompt (the system prompt, the newest message), as the
    server computes them: it checkpoints a model whose state cannot be cut there."""
    history = request.messages
    return tuple(PromptPlanner(builder).kept_length(history[:count], request.tokens) for count in (1, len(history)))


def _folder_name(peer: str) -> str:
    """A peer's work folder: its name, without the separators a `remote:URL` peer's name has."""
    return "".join(character if character.isalnum() or character in "+-._" else "_" for character in peer)


def _settings_for(settings: PeerSettings, workload: Workload) -> PeerSettings:
    """A workload of several clients gives each a sequence (chatapp, one spare) or a slot (llama-server);
    one whose prompts need a longer context (F's tools) gets it, and llama-server the workload's template."""
    context = max(settings.context, workload.context)
    settings = replace(settings, context=context, server_template=workload.server_template)
    if workload.clients <= 1:
        return settings
    sequences = max(settings.chatapp_sequences, workload.clients + 1)
    return replace(settings, chatapp_sequences=sequences, slots=workload.clients)


def _server_peak(peer: Peer) -> int:
    """A separate server process's peak RSS (0 for in-process peers)."""
    reader = getattr(peer, "peak_rss_bytes", None)
    if callable(reader):
        try:
            return int(reader() or 0)
        except Exception:
            return 0
    return 0


@dataclass(frozen=True)
class LlamaServerFactory:
    """Starts llama-server peers; the server peer's module is imported only when one is made."""

    binary: Path
    cache_ram_mib: int
    name: str = SERVER_PEER

    def __call__(self, settings: PeerSettings, folder: Path) -> Peer:
        from chatapp.benchmark.llama_server import LlamaServerPeer

        template = None
        if settings.server_template is not None:
            folder.mkdir(parents=True, exist_ok=True)
            template = folder / "chat_template.jinja"
            template.write_text(settings.server_template, encoding="utf-8")
        return LlamaServerPeer(
            self.binary,
            settings.model_path,
            context=settings.context,
            threads=settings.threads,
            cache_ram_mib=self.cache_ram_mib,
            slots=settings.slots,
            batch=settings.n_batch,
            gpu_layers=settings.gpu_layers,
            chat_template_file=template,
        )


def find_llama_server(explicit: str | None) -> Path | None:
    if explicit:
        return Path(explicit).expanduser()
    try:
        from chatapp.benchmark.llama_server import default_llama_server_path

        path = default_llama_server_path()
    except Exception:
        return None
    return path if path.is_file() else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="smaller workloads, for a first look (minutes, not the full run)"
    )
    parser.add_argument("--scale", choices=sorted(SCALES), help=argparse.SUPPRESS)
    parser.add_argument(
        "--workloads",
        default=",".join(ALL_NAMES),
        help="which workloads, e.g. A,C (default: all: the peers on A-F, K (a coding agent's session over "
        "Anthropic's Messages API) and J (new coding-agent conversations as Claude Code begins them), then "
        "chatapp's cache figures L "
        "(lookup among many conversations), S (storage of conversations on one persona), R (what one "
        "restore and one total miss cost, step by step), P (prefill speed beside llama-server), N (clients "
        "at once over HTTP beside llama-server -np N) and G "
        "(eviction policies replayed on request traces, no model)); W only when named: one large prefix stored "
        "and restored, peak memory and time (with --model a wide-KV model: tools/wide_model.py)",
    )
    parser.add_argument(
        "--peers",
        default=",".join(DEFAULT_PEERS),
        help=f"which peers, in order (default: {','.join(DEFAULT_PEERS)}, and {SERVER_PEER} when it is "
        "built; the first is the reference for the answers). remote:URL: chatapp through its remote engine "
        f"in front of a server already running (llama-server or chatapp serve; API key in ${ENV_BACKEND_KEY}); "
        f"{LOOPBACK_PEER}: the same in front of a chatapp serve the bench starts; +warm after either adds "
        "the warm-ahead on C",
    )
    parser.add_argument(
        "--out", default="bench-results", help="folder for bench.json and ttft.svg (default ./bench-results)"
    )
    parser.add_argument("--model", help="GGUF model (default: the bundled model)")
    parser.add_argument("--threads", type=int, help="CPU threads for every peer (default: one per core)")
    parser.add_argument(
        "--n-gpu-layers",
        type=int,
        default=0,
        metavar="N",
        help="layers every peer offloads to a GPU, -1 for all (default 0: every peer on the CPU); "
        "on a device the restore figure R compares restores with llama.cpp's own load there",
    )
    parser.add_argument(
        "--context",
        type=int,
        help="context per conversation for every peer (default: 8192, quick 512; F gets at least what its "
        "tools need: 4096 at quick)",
    )
    parser.add_argument("--max-tokens", type=int, help="answer length for every request (default: 32, quick 2)")
    parser.add_argument(
        "--ram-budget-mib",
        type=int,
        default=512,
        help="RAM budget for every peer: chatapp's RAM tier, LlamaRAMCache, llama-server --cache-ram (default 512)",
    )
    parser.add_argument(
        "--disk-budget-mib", type=int, default=4096, help="disk cache budget for chatapp and LlamaDiskCache"
    )
    parser.add_argument(
        "--llama-server",
        metavar="PATH",
        help="llama-server binary (default: the one tools/build_llama_server.py builds)",
    )
    parser.add_argument(
        "--allow-mismatch", action="store_true", help="report peers whose answers differ, without failing"
    )
    parser.add_argument("--keep", action="store_true", help="keep the peers' cache folders (in --out/work)")


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class BenchRefused(ChatappError):
    """The bench's arguments name something it cannot run (exit status 2, one line)."""


@dataclass(frozen=True)
class BenchPlan:
    """What one bench run measures, read from its arguments."""

    scale: Scale
    settings: PeerSettings
    max_tokens: int
    workload_names: tuple[str, ...]
    factories: dict[str, PeerFactory]
    server: Path | None  # llama-server, where built: a peer, and the yardstick of P and N


def plan_from(args: argparse.Namespace) -> BenchPlan:
    """The run the arguments ask for; BenchRefused naming what is unknown or missing."""
    scale: Scale = SCALES[args.scale or ("quick" if args.quick else "full")]
    model_path = resolve_model(Path(args.model).expanduser() if args.model else None)
    workload_names = tuple(name.strip().upper() for name in args.workloads.split(",") if name.strip())
    peer_names = [name.strip() for name in args.peers.split(",") if name.strip()]
    try:
        remotes = {name: remote for name in peer_names if (remote := remote_peer_factory(name)) is not None}
    except PeerSpecError as error:
        raise BenchRefused(str(error)) from None
    unknown = [name for name in workload_names if name not in (*ALL_NAMES, *OPT_IN_NAMES)]
    unknown += [name for name in peer_names if name not in (*PEERS, SERVER_PEER, SERVE_PEER, *remotes)]
    if unknown:
        raise BenchRefused(
            f"unknown workload or peer: {', '.join(unknown)} (workloads {','.join((*ALL_NAMES, *OPT_IN_NAMES))}; "
            f"peers {','.join([*DEFAULT_PEERS, SERVER_PEER])}, {LOOPBACK_PEER}+warm, remote:URL)"
        )
    factories = _factories(peer_names, remotes)
    server = find_llama_server(args.llama_server)
    if args.llama_server and (server is None or not server.is_file()):
        raise BenchRefused(
            f"--llama-server {args.llama_server}: no such file (build it with tools/build_llama_server.py)"
        )
    if server is not None and (SERVER_PEER in peer_names or args.peers == ",".join(DEFAULT_PEERS)):
        factories[SERVER_PEER] = LlamaServerFactory(server, args.ram_budget_mib)
    elif server is None:
        print(SKIP_SERVER, file=sys.stderr)
    settings = PeerSettings(
        model_path=model_path,
        context=args.context or scale.context,
        threads=args.threads or default_thread_count(),
        ram_budget_bytes=args.ram_budget_mib * MIB,
        disk_budget_bytes=args.disk_budget_mib * MIB,
        gpu_layers=args.n_gpu_layers,
    )
    return BenchPlan(scale, settings, args.max_tokens or scale.max_tokens, workload_names, factories, server)


def _factories(peer_names: list[str], remotes: dict[str, RemotePeerFactory]) -> dict[str, PeerFactory]:
    """The peers named, in order; a remote one whose server cannot be reached is refused here."""
    factories: dict[str, PeerFactory] = {}
    for name in peer_names:
        if name in PEERS:
            factories[name] = PEERS[name]
        elif name == SERVE_PEER:
            from chatapp.benchmark.serve_peer import ChatappServePeer

            factories[name] = ChatappServePeer
        elif name in remotes:
            factories[remotes[name].name] = remotes[name]
    for factory in factories.values():
        if isinstance(factory, RemotePeerFactory):
            try:
                factory.check()
            except ChatappError as error:
                where = f" (the bench reads it from ${ENV_BACKEND_KEY})" if "API key" in str(error) else ""
                raise BenchRefused(f"peer {factory.name}: {error}{where}") from None
    return factories


def run(args: argparse.Namespace) -> int:
    try:
        plan = plan_from(args)
    except BenchRefused as error:
        print(f"chatapp bench: {error}", file=sys.stderr)
        return 2
    settings, max_tokens = plan.settings, plan.max_tokens
    started = time.perf_counter()
    _log(
        f"bench: model {settings.model_path.name}, scale {plan.scale.name}, context {settings.context}, "
        f"threads {settings.threads}, max_tokens {max_tokens}, peers {','.join(plan.factories)}, "
        f"workloads {','.join(plan.workload_names)}"
    )
    from cache.fingerprint import hash_file

    settings = replace(settings, model_fingerprint=hash_file(settings.model_path))
    workloads = _built_workloads(plan)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="work-", dir=out) if args.keep else tempfile.mkdtemp(prefix="chatapp-bench-"))
    runs: list[dict[str, Any]] = []
    figures = FigureRuns()

    def meta(complete: bool) -> dict[str, Any]:
        return _meta(plan, time.perf_counter() - started, complete, work if args.keep else None, figures)

    reference = next(iter(plan.factories), None)
    try:
        for workload in workloads:  # peers side by side, close in time: the machine's load drifts
            runs += _peers_on(workload, plan, settings, work)
            write_reports(out, meta(complete=False), runs, reference_peer=reference)  # a long run keeps its figures
        figures.measure(plan.workload_names, FigureJob(plan.scale, settings, plan.server, work, max_tokens, _log))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    rows, found, verdicts, files = write_reports(
        out, meta(complete=True), runs, reference_peer=reference, more_verdicts=figures.verdicts()
    )
    _print_summary(plan, time.perf_counter() - started, rows, runs, figures)
    if verdicts:
        print()
        print(goals_table(verdicts))
    print(f"wrote {files['json']} and {files['svg']}")
    return _mismatches_reported(found, allow=args.allow_mismatch)


def _built_workloads(plan: BenchPlan) -> list[Workload]:
    """The workloads the plan names that send requests, built (and logged) before any peer runs."""
    built = (*WORKLOAD_NAMES, *AGENT_NAMES)
    names = tuple(name for name in plan.workload_names if name in built)
    workloads = build_workloads(plan.settings.model_path, plan.scale, names)
    for workload in workloads:
        longer = f", context {workload.context:,}" if workload.context > plan.settings.context else ""
        _log(
            f"workload {workload.name}: {len(workload.requests)} requests, {workload.prompt_tokens:,} prompt tokens "
            f"(longest {max(len(r.tokens) for r in workload.requests):,}){longer}"
        )
    return workloads


def _peers_on(workload: Workload, plan: BenchPlan, settings: PeerSettings, work: Path) -> list[dict[str, Any]]:
    """Every peer that serves `workload`, one after another; K's and J's chosen answers checked cold."""
    runs = []
    for name, factory in plan.factories.items():
        if getattr(factory, "drafts_only", False) and not any(request.draft for request in workload.requests):
            continue  # warm-ahead and type-ahead need to know how the app builds the prompt (C)
        if workload.protocol == "anthropic" and name not in MESSAGES_PEERS:
            continue  # K and J go over Anthropic's Messages API: the servers that serve it
        peer_settings = _settings_for(settings, workload)
        folder = work / _folder_name(name) / workload.name
        run = run_peer_on_workload(name, factory, peer_settings, workload, folder, plan.max_tokens, _log)
        if workload.protocol == "anthropic" and name == SERVE_PEER:
            run["cold_check"] = cold_check(peer_settings, workload, run, plan.max_tokens, _log)
        runs.append(run)
    return runs


def _meta(plan: BenchPlan, elapsed_s: float, complete: bool, work: Path | None, figures: FigureRuns) -> dict[str, Any]:
    """bench.json's account of the run: what was measured, how, and the figures beside the peers."""
    settings = plan.settings
    return {
        "model": str(settings.model_path),
        "scale": plan.scale.name,
        "context": settings.context,
        "threads": settings.threads,
        "max_tokens": plan.max_tokens,
        "peers": list(plan.factories),
        "workloads": list(plan.workload_names),
        "llama_cpp_python": llama_cpp.__version__,
        "elapsed_s": elapsed_s,
        "complete": complete,
        "rss": "in-process VmRSS sampled every 10 ms (servers the bench starts: plus their process's peak)",
        "ttft": (
            "Llama peers: create_completion call to first streamed chunk; chatapp: engine's figure from "
            "submission to the first sampled token (chatapp+typed: plus any warm-up still running when Enter "
            "is pressed); servers and remote peers: sending the request to the first streamed text"
        ),
        "between_requests": (
            "B and D back to back; otherwise each peer settles off the clock (chatapp: the answer's "
            "recompute and cache store; Llama peers save inside the call); wall time includes it"
        ),
        "work_folder": str(work) if work is not None else None,
        "cache_figures": figures.record(),
    }


def _print_summary(
    plan: BenchPlan, elapsed_s: float, rows: list[Any], runs: list[dict[str, Any]], figures: FigureRuns
) -> None:
    settings = plan.settings
    print(
        f"chatapp bench: {plan.scale.name} scale, model {settings.model_path.name}, context {settings.context}, "
        f"threads {settings.threads}, max_tokens {plan.max_tokens}, {elapsed_s:.0f} s"
    )
    if rows:
        print(table(rows))
        print(NOTES)
        if any(run["workload"] == "F" for run in runs):
            print()
            print(reuse_table(runs, "F"))
        for item in runs:
            if item.get("restart"):
                print(f"{item['workload']} {item['peer']}: {item['restart']}")
    for printed in figures.tables():
        print()
        print(printed)


def _mismatches_reported(found: list[dict[str, Any]], *, allow: bool) -> int:
    """Answers that differ from the reference peer's at temperature 0: a failure (2) unless allowed."""
    if not found:
        return 0
    stream = sys.stdout if allow else sys.stderr
    print(
        f"{'warning' if allow else 'FAILED'}: {len(found)} answer(s) differ from "
        f"{found[0]['reference_peer']}'s at temperature 0:",
        file=stream,
    )
    for item in found:
        print(
            f"  peer {item['peer']}, workload {item['workload']}, request {item['request'] + 1} ({item['label']}): "
            f"expected {item['expected']!r}, got {item['got']!r}",
            file=stream,
        )
    return 0 if allow else 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chatapp bench", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
