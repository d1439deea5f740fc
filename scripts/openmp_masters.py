"""One engine's decode speed, alone and with a second thread that has run llama.cpp's OpenMP kernels.

llama.cpp (built with OpenMP, as llama-cpp-python builds it) computes each graph with a team of
OpenMP threads; GCC's libgomp keeps a team for every thread that has started one, for as long as
that thread lives. Once those threads outnumber the CPUs, libgomp stops spinning at barriers and
sleeps almost at once (100 spins), and a one-token decode (hundreds of barriers) slows down. Two
engines in one process (a model pool, a test's cold and cached engines) are such a case. chatapp
therefore sets libgomp's waiting policy when it starts (chatapp/openmp_policy.py). Measured on 2
vCPUs, 2026-12-04: 105-111 answer tokens/s alone; with a second live thread that had decoded, 38-52
before that policy (run with `OMP_WAIT_POLICY=` set empty to see it: a policy the user set is kept,
and libgomp reads an empty one as none) and 88-116 with it (the spin count does not matter here:
with its threads outnumbering the CPUs libgomp spins at most 1,000 times under `active`).

    .venv/bin/python scripts/openmp_masters.py [alone|second-thread]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.llama_native import NativeContext, NativeModel
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.model_files import bundled_model_path

ANSWER_TOKENS = 300


def main() -> None:
    case = sys.argv[1] if len(sys.argv) > 1 else "second-thread"
    if case not in ("alone", "second-thread"):
        raise SystemExit("usage: openmp_masters.py [alone|second-thread]")
    model_path = bundled_model_path()
    config = EngineConfig(model_path=model_path, context_cap=2048, sequences=1, threads=2)
    with Engine(config) as engine:
        if case == "second-thread":  # this (main) thread runs one decode and stays alive
            model = NativeModel(model_path)
            context = NativeContext(model, n_sequences=1, n_ctx_per_sequence=256, n_threads=2)
            context.decode(list(range(100, 130)), start_pos=0, sequence=0, logits_for_last=True)
        prompt = tuple(range(100, 140))
        speeds = []
        sampling = SamplingParams(temperature=0.0, max_tokens=ANSWER_TOKENS)
        for _ in range(3):
            request = GenerationRequest(prompt, sampling, use_cache=False)
            speeds.append(engine.generate(request).wait().stats.decode_tokens_per_s)
        print(f"{case}: answer tokens/s {', '.join(f'{speed:.1f}' for speed in speeds)}")


if __name__ == "__main__":
    main()
