"""Command line: `chatapp` opens the chat screen; `chatapp ask` answers one question; `chatapp serve`
serves the OpenAI and Ollama APIs; `chatapp bench` and `chatapp cache` measure and manage the cache.

User errors print one line on stderr and exit with status 2; Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import closing
from pathlib import Path
from typing import Any, get_args

from chatapp import __version__
from chatapp.benchmark.runner import add_arguments as add_bench_arguments
from chatapp.benchmark.runner import run as run_bench
from chatapp.documents import load_document
from chatapp.errors import ChatappError, SettingsError
from chatapp.server.access import ORIGINS_ENV, AccessPolicy, split_list
from chatapp.services.ask import AskRequest, ask
from chatapp.services.cache_admin import cache_stats, clear_cache, clear_model_cache, format_stats, prune_cache
from chatapp.services.cache_advice import advise, format_advice
from chatapp.services.cache_verify import resume_reuse, verify
from chatapp.services.model_list import format_models, model_record
from chatapp.services.startup import (
    Workspace,
    engine_notices,
    make_new_files_private,
    open_workspace,
    quiet_native_logs,
)
from chatapp.services.units import count_of
from chatapp.settings import Settings

EXIT_INTERRUPTED = 130
ENV_API_KEY = "CHATAPP_API_KEY"
ENV_BACKEND_KEY = "CHATAPP_BACKEND_KEY"
MAX_BODY_BYTES = 32 << 20


def _engine_options(default: object = None) -> argparse.ArgumentParser:
    """Options shared by every command: where data lives and how the model runs.

    Given before the command (`chatapp --model M ask ...`) or after it, they mean the same:
    the commands' copies default to SUPPRESS, so an option left out after the command
    never overwrites one given before it.
    """
    parser = argparse.ArgumentParser(add_help=False, argument_default=default)
    group = parser.add_argument_group("model and data")
    group.add_argument(
        "--model",
        metavar="PATH|NAME",
        help="GGUF model file, or a name that `chatapp models` lists (default: the bundled SmolLM2-135M)",
    )
    group.add_argument(
        "--data-dir", metavar="DIR", help="where conversations, cache and config live (or $CHATAPP_HOME)"
    )
    group.add_argument("--context", type=int, metavar="N", help="largest context per conversation, in tokens")
    group.add_argument("--n-gpu-layers", type=int, metavar="N", help="layers to offload to the GPU (-1: all)")
    group.add_argument(
        "--kv-type",
        choices=get_args(Settings.model_fields["kv_type"].annotation),  # the setting's own choices
        help="the KV cache's number format: q8_0 and q4_0 keep smaller states (default: f16)",
    )
    group.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="CPU threads (default: one per core)",
    )
    remote = parser.add_argument_group("remote engine")
    remote.add_argument(
        "--backend",
        metavar="URL",
        help="answer with a server instead of a model here: llama-server or another chatapp serve "
        "(e.g. http://gpu-box:8080)",
    )
    remote.add_argument("--backend-key", metavar="KEY", help=f"the backend's API key (or ${ENV_BACKEND_KEY})")
    remote.add_argument("--backend-model", metavar="NAME", help="the name to show for the backend's model")
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chatapp",
        description="Chat with a local GGUF model; every prompt beginning is computed once.",
        parents=[_engine_options()],
    )
    shared = _engine_options(argparse.SUPPRESS)
    parser.add_argument("--version", action="version", version=f"chatapp {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("chat", parents=[shared], help="open the chat screen (the default)")
    _add_ask(commands, shared)
    _add_serve(commands, shared)
    bench_parser = commands.add_parser(
        "bench",
        help="measure the cache against llama-cpp-python's caches, llama-server and no cache",
        description="Run workloads A-F (persona, few-shot, document, many sessions, restart, agent loop) on "
        "every peer, side by side in one run, then the cache figures L, S, R (the cost of one restore and one "
        "miss) and G (eviction policies on request "
        "traces); print a table and the goals, and write bench.json and ttft.svg.",
    )
    add_bench_arguments(bench_parser)
    models_parser = commands.add_parser(
        "models",
        parents=[shared],
        help="list the GGUF models on this machine, with the names --model takes",
        description="List the GGUF models found in the model_folders setting, with the bundled model, and in "
        "the places other tools download to: Ollama ($OLLAMA_MODELS, ~/.ollama/models), LM Studio "
        "(~/.lmstudio/models), the Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub) "
        "and llama.cpp's ($LLAMA_CACHE, ~/.cache/llama.cpp), Jan and GPT4All. Read from each file's header; "
        "nothing is loaded.",
    )
    models_parser.add_argument("--json", action="store_true", help="print the models as a JSON list")
    cache_parser = commands.add_parser("cache", parents=[shared], help="inspect or empty the KV cache")
    cache_commands = cache_parser.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    stats_parser = cache_commands.add_parser("stats", parents=[shared], help="entries, bytes, budgets and hit rate")
    stats_parser.add_argument("--json", action="store_true", help="print the statistics as JSON")
    advise_parser = cache_commands.add_parser(
        "advise",
        parents=[shared],
        help="what other RAM and disk budgets and TTLs would have reused of your own requests",
        description="Replays the cache's request log (hashes, sizes and times of what was asked for and "
        "stored; no text) against other budgets: the share of prompt tokens reused, the prefill time "
        "saved at this machine's measured speed, and a suggested disk budget.",
    )
    advise_parser.add_argument("--json", action="store_true", help="print the advice as JSON")
    advise_parser.add_argument(
        "--log",
        type=Path,
        action="append",
        metavar="FILE",
        help="a request log to read instead of this cache's (e.g. another machine's requests.log); repeatable",
    )
    cache_commands.add_parser("prune", parents=[shared], help="drop expired entries now")
    verify_parser = cache_commands.add_parser(
        "verify",
        parents=[shared],
        help="check the sampled answers that reused the cache against cold runs, bit for bit",
        description="One answer in every `cache_checks` (a setting, 20) that reused cached KV is kept as a "
        "sample; the app checks it in idle time, and `chatapp ask` leaves its sample waiting. This loads the model "
        "and checks what waits: each prompt with the cache and without it, the next token's logits compared bit "
        "for bit. A difference stops reuse for this model and build (every prompt computed in full); it exits "
        "with 1 while reuse is stopped.",
    )
    verify_parser.add_argument("--limit", type=int, default=0, metavar="N", help="check at most N prompts")
    verify_parser.add_argument(
        "--clear",
        action="store_true",
        help="resume reuse that a failed check stopped, for every model in the folder (loads no model)",
    )
    cache_commands.add_parser(
        "clear",
        parents=[shared],
        help="remove every cached entry and its files; with --model PATH|NAME, only that model's",
    )
    return parser


def _add_ask(commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: argparse.ArgumentParser) -> None:
    """`chatapp ask QUESTION`: one answer on stdout."""
    ask_parser = commands.add_parser(
        "ask",
        parents=[shared],
        help="answer one question without the chat screen",
        description="Answer one question; the answer streams to stdout. With --json, a JSON object "
        "with the answer and its statistics is printed as the last line.",
    )
    ask_parser.add_argument("question", metavar="QUESTION")
    persona = ask_parser.add_mutually_exclusive_group()
    persona.add_argument("--system", metavar="TEXT", help="system prompt (persona)")
    persona.add_argument("--system-file", metavar="FILE", type=Path, help="read the system prompt from FILE")
    ask_parser.add_argument("--doc", metavar="FILE", type=Path, help="a .txt, .md or .pdf document to ask about")
    ask_parser.add_argument("--max-tokens", type=int, metavar="N", help="longest answer in tokens")
    ask_parser.add_argument("--temperature", type=float, metavar="T", help="0 is greedy and reproducible")
    ask_parser.add_argument("--top-p", type=float, metavar="P", help="nucleus sampling threshold")
    ask_parser.add_argument("--seed", type=int, metavar="N", help="sampling seed")
    ask_parser.add_argument("--no-cache", action="store_true", help="compute the whole prompt; no lookup, no store")
    ask_parser.add_argument("--json", action="store_true", help="print a JSON object with statistics at the end")


def _add_serve(commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: argparse.ArgumentParser) -> None:
    """`chatapp serve`: the HTTP APIs."""
    serve_parser = commands.add_parser(
        "serve",
        parents=[shared],
        help="serve the model and its cache over the OpenAI, Anthropic and Ollama HTTP APIs",
        description="An HTTP server on the same engine, prefix cache and data folder as the app: "
        "OpenAI's /v1/chat/completions, /v1/responses, /v1/completions and /v1/models, Anthropic's /v1/messages "
        "and /v1/messages/count_tokens (Claude Code), Ollama's /api/chat, /api/generate, /api/tags, /api/show, "
        "/api/ps and /api/version, and /health and /metrics. Ctrl-C (or SIGTERM) stops it cleanly, with the "
        "cache written.",
    )
    serve_parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    serve_parser.add_argument("--port", type=int, default=8080, metavar="N", help="port to listen on (default: 8080)")
    serve_parser.add_argument(
        "--api-key",
        metavar="KEY",
        default=os.environ.get(ENV_API_KEY) or None,
        help=f"require 'Authorization: Bearer KEY' on every route but /health (or ${ENV_API_KEY})",
    )
    serve_parser.add_argument(
        "--allowed-hosts",
        metavar="NAMES",
        action="append",
        default=[],
        help="names besides localhost, 127.0.0.1 and [::1] that requests may address the server by "
        "(comma-separated or repeated, * for any): bound to a loopback address, a request for another Host is "
        "refused, as a web page reaching the server by DNS rebinding would send",
    )
    serve_parser.add_argument(
        "--allowed-origins",
        metavar="ORIGINS",
        action="append",
        default=[],
        help="web pages besides this machine's that may call the server, as origins such as "
        "https://app.example.com or https://*.example.com (comma-separated or repeated, * for any; also "
        f"${ORIGINS_ENV}); a request a browser sends from any other page is refused",
    )
    serve_parser.add_argument(
        "--max-pending",
        type=int,
        default=16,
        metavar="N",
        help="requests waiting or running at once; more get 503 with Retry-After (default: 16)",
    )
    serve_parser.add_argument(
        "--max-tokens",
        type=int,
        metavar="N",
        help="longest answer to a request that sets no max_tokens (default: until the model ends it or the "
        "context is full, as OpenAI, Ollama and llama-server answer)",
    )
    serve_parser.add_argument(
        "--reasoning-history",
        choices=("kept", "template"),
        default="kept",
        help="kept (the default): earlier answers' reasoning (<think>...</think>) stays in the history as "
        "generated, and the whole conversation stays a cache hit; template: dropped before the latest "
        "question as templates such as Qwen 3's write the history, which changes the prompt from the "
        "last answer before the new question on, so every new question misses the cache from there",
    )
    serve_parser.add_argument(  # its name until 2026-12-06, when it kept the billing line alone
        "--keep-billing-line", dest="prompts_as_sent", action="store_true", help=argparse.SUPPRESS
    )
    serve_parser.add_argument(
        "--prompts-as-sent",
        action="store_true",
        help="build Claude Code's prompts as they come: its first system block (x-anthropic-billing-header: ..., "
        "metadata for Anthropic's billing whose last part follows each conversation's first message) sent to "
        "the model, and its system message after a new conversation's first question left there; by default "
        "the billing line is left out and that message joins the system prompt, so that every new conversation "
        "reuses the instructions computed before",
    )
    serve_parser.add_argument(
        "--sort-tools",
        action="store_true",
        help="offer a request's tools in name order: for clients that list their tools in another order "
        "from one request to the next, which would otherwise change the prompt and miss the cache from there on",
    )
    _add_serve_model_options(serve_parser)


def _add_serve_model_options(serve_parser: argparse.ArgumentParser) -> None:
    """The models `chatapp serve` answers for: names, how many at once, for how long."""
    serve_parser.add_argument(
        "--model-alias",
        action="append",
        default=[],
        metavar="NAME",
        help="another name the model answers to, listed by /v1/models and /api/tags (repeatable): for "
        "clients with a model name built in, e.g. --model-alias gpt-4o",
    )
    serve_parser.add_argument(
        "--max-loaded",
        type=int,
        default=3,
        metavar="N",
        help="models loaded at once, the started one included: a request naming another model found on this "
        "machine (`chatapp models`) loads it, unloading the least recently used idle one first (default: 3)",
    )
    serve_parser.add_argument(
        "--models-memory",
        type=int,
        metavar="MiB",
        help="the model files loaded at once may take this much memory together "
        "(default: three quarters of this machine's)",
    )
    serve_parser.add_argument(
        "--keep-alive",
        default="5m",
        metavar="DURATION",
        help="how long a model loaded for a request stays loaded once idle, as Ollama's keep_alive: 30s, 5m, "
        "1h, -1 for until the server stops (default: 5m; a request's keep_alive overrides it; the started "
        "model stays loaded)",
    )
    serve_parser.add_argument(
        "--any-model",
        action="store_true",
        help="answer whatever model a request names, instead of a 404 for a name not served here",
    )


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Settings given on the command line; None means 'use the settings file'."""
    return {
        "model": args.model,
        "context_cap": args.context,
        "n_gpu_layers": args.n_gpu_layers,
        "kv_type": args.kv_type,
        "threads": args.threads,
        "backend": args.backend,
        "backend_key": args.backend_key or os.environ.get(ENV_BACKEND_KEY) or None,
        "backend_model": args.backend_model,
        "max_tokens": getattr(args, "max_tokens", None),
        "temperature": getattr(args, "temperature", None),
        "top_p": getattr(args, "top_p", None),
        "seed": getattr(args, "seed", None),
    }


def _read_system_prompt(args: argparse.Namespace) -> str | None:
    if args.system_file is None:
        system: str | None = args.system
        return system
    try:
        text = args.system_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SettingsError(f"system prompt file {args.system_file} does not exist; check the path") from None
    except (OSError, UnicodeDecodeError) as error:
        raise SettingsError(
            f"cannot read system prompt file {args.system_file} ({error}); use a UTF-8 text file"
        ) from None
    return text.strip() or None


def _write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def run_ask(args: argparse.Namespace, workspace: Workspace) -> int:
    system_prompt = _read_system_prompt(args)
    document = load_document(args.doc) if args.doc is not None else None
    request = AskRequest(
        question=args.question,
        sampling=workspace.sampling(),
        system_prompt=system_prompt,
        document=document,
        use_cache=not args.no_cache,
    )
    with closing(workspace.open_engine(use_cache=not args.no_cache, sequences=1)) as engine:
        model, fingerprint = workspace.model_identity(engine.info)
        record = ask(engine, request, model=model, model_fingerprint=fingerprint, on_text=_write_stdout)
    _write_stdout("\n")
    for notice in engine_notices(engine):
        print(f"chatapp: warning: {notice}", file=sys.stderr)
    if args.json:
        _write_stdout(json.dumps(record, ensure_ascii=False) + "\n")
    return 0


def run_cache(args: argparse.Namespace, workspace: Workspace) -> int:
    if args.cache_command == "stats":
        stats = cache_stats(workspace)
        _write_stdout((json.dumps(stats) if args.json else format_stats(stats)) + "\n")
    elif args.cache_command == "advise":
        advice = advise(workspace.kv_cache_dir, workspace.settings, args.log)
        if advice is None:
            _write_stdout(
                f"no requests logged yet in {workspace.kv_cache_dir}: ask or serve a few, then run this again\n"
            )
        else:
            _write_stdout((json.dumps(advice.as_json()) if args.json else format_advice(advice)) + "\n")
    elif args.cache_command == "prune":
        _write_stdout(f"pruned {prune_cache(workspace):,} expired entries\n")
    elif args.cache_command == "verify":
        return run_cache_verify(args, workspace)
    elif args.model:
        name, removed = clear_model_cache(workspace, args.model)
        _write_stdout(f"removed {removed:,} entries of {name} from {workspace.kv_cache_dir}\n")
    else:
        _write_stdout(f"removed {clear_cache(workspace):,} entries from {workspace.kv_cache_dir}\n")
    return 0


def run_cache_verify(args: argparse.Namespace, workspace: Workspace) -> int:
    if args.clear:
        resumed = resume_reuse(workspace.kv_cache_dir)
        _write_stdout(f"reuse resumed for {count_of(resumed, 'stopped model')}\n")
        return 0
    if args.limit < 0:
        raise ChatappError(f"--limit {args.limit}: give a number of prompts, 0 or more (0: all)")
    checking = workspace.with_settings(cache_checks=0)  # this run samples nothing new
    with closing(checking.open_engine(sequences=1)) as engine:
        report = verify(engine, engine.info.name, args.limit)
    _write_stdout(report.describe() + "\n")
    return 1 if report.stopped else 0


def run_models(args: argparse.Namespace, workspace: Workspace) -> int:
    models = workspace.model_catalog().models()
    if args.json:
        _write_stdout(json.dumps([model_record(model) for model in models], indent=2) + "\n")
    else:
        _write_stdout(format_models(models) + "\n")
    return 0


def run_serve(args: argparse.Namespace, workspace: Workspace) -> int:
    from chatapp.server.run import check_port_free, serve
    from chatapp.services.durations import duration_seconds
    from chatapp.services.model_pool import ModelPool, PoolLimits, default_memory_budget
    from chatapp.services.serving import MAX_ANSWER_TOKENS, Serving, ServingOptions

    if not 0 < args.port < 65536:
        raise SettingsError(f"--port {args.port} is not a port; use 1-65535")
    if args.api_key is not None and not args.api_key.strip():
        raise SettingsError(f"the API key is empty; pass a non-empty --api-key (or ${ENV_API_KEY}), or none at all")
    if args.max_pending < 1:
        raise SettingsError(f"--max-pending {args.max_pending} must be at least 1")
    try:
        keep_alive = duration_seconds(args.keep_alive)
    except ValueError as error:
        raise SettingsError(f"--keep-alive: {error}") from None
    if args.max_loaded < 1:
        raise SettingsError(f"--max-loaded {args.max_loaded} must be at least 1")
    if args.models_memory is not None and args.models_memory < 1:
        raise SettingsError(f"--models-memory {args.models_memory} must be a positive number of MiB")
    if args.max_tokens is not None and not 0 < args.max_tokens <= MAX_ANSWER_TOKENS:
        raise SettingsError(f"--max-tokens {args.max_tokens} is not an answer length; use 1-{MAX_ANSWER_TOKENS:,}")
    aliases = tuple(alias.strip() for alias in args.model_alias)
    if not all(aliases):
        raise SettingsError("a --model-alias is empty; pass a model name such as gpt-4o")
    access = access_policy(args)
    check_port_free(args.host, args.port)

    def say(line: str) -> None:
        print(f"chatapp: {line}" if line.startswith("warning") else line, file=sys.stderr, flush=True)

    say(f"loading {workspace.model_label()}...")
    options = ServingOptions(
        max_pending=args.max_pending,
        default_max_tokens=args.max_tokens,
        sort_tools=args.sort_tools,
        keep_reasoning=args.reasoning_history == "kept",
        prompts_as_sent=args.prompts_as_sent,
    )
    serving = Serving(workspace, options)
    try:
        limits = PoolLimits(
            memory_bytes=(args.models_memory << 20) if args.models_memory else default_memory_budget(),
            max_loaded=args.max_loaded,
            keep_alive_s=keep_alive,
        )
        pool = ModelPool(
            serving,
            catalog=None if workspace.remote is not None else workspace.model_catalog(),
            open_serving=serving.for_model,
            limits=limits,
            aliases=aliases,
            any_model=args.any_model,
        )
    except BaseException:
        serving.close()
        raise
    serve(
        pool,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        body_limit_bytes=MAX_BODY_BYTES,
        say=say,
        access=access,
    )
    return 0


def access_policy(args: argparse.Namespace) -> AccessPolicy:
    """The Host and Origin rules `chatapp serve`'s flags (and $CHATAPP_ALLOWED_ORIGINS) set."""
    origins = [*args.allowed_origins, os.environ.get(ORIGINS_ENV, "")]
    return AccessPolicy.configured(args.host, split_list(args.allowed_hosts), split_list(origins))


def run_chat(workspace: Workspace) -> int:
    from chatapp.tui.app import ChatApp

    if workspace.remote is None:
        _ = workspace.model_path  # resolving it checks the file: fail before the screen opens
    app = ChatApp(workspace)
    app.run()
    return app.return_code or 0  # 128 + the signal when a hang-up or SIGTERM closed it


ENV_DEBUG = "CHATAPP_DEBUG"
EXIT_INTERNAL = 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_native_logs()
    make_new_files_private()
    try:
        if args.command == "bench":
            return run_bench(args)
        workspace = open_workspace(args.data_dir, _overrides(args))
        if args.command == "ask":
            return run_ask(args, workspace)
        if args.command == "cache":
            return run_cache(args, workspace)
        if args.command == "models":
            return run_models(args, workspace)
        if args.command == "serve":
            return run_serve(args, workspace)
        return run_chat(workspace)
    except ChatappError as error:
        print(f"chatapp: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("chatapp: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except Exception as error:
        if os.environ.get(ENV_DEBUG):
            raise
        print(
            f"chatapp: internal error: {type(error).__name__}: {error} (run with {ENV_DEBUG}=1 for the details, "
            "and please report it)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
