"""Reproduce a crash of llama.cpp's Vulkan backend (seen on Mesa's llvmpipe) with two engines in one process.

Two engines on the tiny hybrid test model (LFM2: short-convolution layers and attention) with
flash attention on, strictly one at a time (the device's turns, device_turns.py, serialize every
llama.cpp call and wait for the device after each step): A answers (no cache), B (with a cache)
answers the same prompt, then A's follow-up crashes the process in about half the runs: a
SIGSEGV in lavapipe's queue thread (gdb: inside libvulkan_lvp.so, while A's thread waits in
libggml-vulkan), or glibc's "corrupted double-linked list" during A's prefill. Measured
2026-12-04 (llama-cpp-python 0.3.36, Debian 12's Mesa llvmpipe, LLVM 15): flash attention on, 8
of 18 runs crashed; off, 0 of 5. Also crashed: B answering without its cache (1 of 4), B an
engine with no cache at all (2 of 6), prompts of token ids spread over the vocabulary instead of
the chat's (1 of 8; ids 5-305: 0 of 8), each engine holding the device for its whole request
instead of a step (1 of 5), LP_NUM_THREADS=0 (1 of 4). Never crashed: one engine alone, B loaded
but idle, and the same decodes on two bare NativeContexts (each on its own thread, or both on
one; 20 rounds; with ids spread over the vocabulary, 24 rounds), nor on two contexts made by
chatapp's load_model (its state self-test and split probe) then decoded bare (12 rounds). So it
is neither two threads in llama.cpp at once, nor the cache's state reads, nor the load-time
probes; what of an engine's request path it needs is not known yet. Ruled out as well: the
recompute of an answer's tokens after it (patched out: 2 of 10 still crashed), llama.cpp's
sampler chain on bare contexts (12 rounds), and bare contexts made by load_model replaying the
engine's calls for these prompts (the chat's tokens, 64-token batches, a checkpoint read between
them: 16 rounds). ggml-vulkan's operator fusion is involved: with GGML_VK_DISABLE_FUSION=1 no
run crashed in 32 (B without a cache: with fusion on the same setup crashed 26 of 90 runs,
whatever else was set; GGML_VK_DISABLE_DESCRIPTOR_REUSE, GGML_VK_DISABLE_GRAPH_OPTIMIZE,
GGML_VK_FA_SPARSE_DISABLE and GGML_VK_PREFER_HOST_MEMORY did not help). The property test met it
as hybrid+flash chunks that died (seeds 9002 and 9012).

Which fusion (2026-12-04, fifth session): ggml-vulkan.cpp from the same sdist, patched so that
ggml_backend_vk_graph_compute drops a fusion whose fusion_string is named in an environment
variable (taken down the same path as its own "need_disable"), built alone (cmake, target
ggml-vulkan) and loaded with LLAMA_CPP_LIB_PATH. GGML_VK_PERF_LOGGER shows three fusions in this
model's graphs, flash attention on or off alike: RMS_NORM_MUL, ROPE_VIEW_SET_ROWS and MUL_MAT_ADD
(only in one-token decodes: a matrix-vector product fused with the residual add after it, m=64
k=64 and m=64 k=128). Runs that crashed: none skipped 3 of 14, ROPE_VIEW_SET_ROWS skipped 4 of 14,
RMS_NORM_MUL skipped 4 of 14, MUL_MAT_ADD skipped 0 of 14 and again 0 of 20 (also
GGML_VK_DISABLE_MULTI_ADD=1 with fusion on: 2 of 10). So it is MUL_MAT_ADD after flash attention
on llvmpipe. The Vulkan validation layer (Debian 12's 1.3.239, GPU-assisted validation asked for)
reported nothing in one run that did not crash (8.5 minutes). `make test-vulkan` therefore sets
GGML_VK_DISABLE_FUSION=1 on llvmpipe (VULKAN_FUSION=on to keep it).

    make vulkan
    GGML_VK_VISIBLE_DEVICES=0 .venv-vulkan/bin/python scripts/vulkan_two_engines_crash.py [on|off] [RUNS]

Each run is a fresh process; it prints how many crashed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = "--child"


def child(flash: bool) -> None:
    from chatapp.engine.engine import Engine, EngineConfig
    from chatapp.engine.requests import GenerationRequest, SamplingParams
    from chatapp.prompting.prompt import ChatMessage
    from chatapp.vocabulary import Role
    from tests.cache_support import cached_engine
    from tests.chatapp.engine.test_cache_properties import CONTEXT, PERSONAS
    from tests.model_factory import TINY_MODEL_THREADS, write_tiny_lfm2

    folder = Path(tempfile.mkdtemp())
    path = write_tiny_lfm2(folder / "tiny.gguf")
    config = EngineConfig(
        model_path=path, context_cap=CONTEXT, sequences=1, threads=TINY_MODEL_THREADS, flash_attention=flash
    )
    first = Engine(config)
    second = cached_engine(
        folder / "kv",
        path,
        block_size=16,
        context=CONTEXT,
        sequences=1,
        threads=TINY_MODEL_THREADS,
        flash_attention=flash,
    )
    try:
        question = [ChatMessage.of(Role.SYSTEM, PERSONAS[2]), ChatMessage.of(Role.USER, "river?")]
        prompt = tuple(first.prompt_builder.build(question))
        answer = first.generate(
            GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=6), use_cache=False)
        ).wait()
        second.generate(GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=6))).wait()
        follow_up = [
            *question,
            ChatMessage.of(Role.ASSISTANT, first.detokenize(list(answer.token_ids))),
            ChatMessage.of(Role.USER, "blue river?"),
        ]
        first.generate(
            GenerationRequest(
                tuple(first.prompt_builder.build(follow_up)),
                SamplingParams(temperature=0.0, max_tokens=7),
                use_cache=False,
            )
        ).wait()
    finally:
        second.close()
        first.close()


def main() -> int:
    if sys.argv[1:2] == [CHILD]:
        child(sys.argv[2] == "on")
        return 0
    flash = (sys.argv[1] if len(sys.argv) > 1 else "on") == "on"
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    crashed = 0
    for run in range(runs):
        done = subprocess.run(
            [sys.executable, __file__, CHILD, "on" if flash else "off"], env=env, capture_output=True, check=False
        )
        crashed += done.returncode != 0
        print(f"run {run + 1}: exit {done.returncode}", flush=True)
    print(f"flash attention {'on' if flash else 'off'}: {crashed} of {runs} runs crashed")
    return 1 if crashed else 0


if __name__ == "__main__":
    raise SystemExit(main())
