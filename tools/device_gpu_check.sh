#!/usr/bin/env bash
# The GPU check as run on the lent GPU machine (no network there): install carried wheels,
# build llama-cpp-python with CUDA from a slimmed sdist, then run the checks, all within one call.
# Carried (ignored) paths, made here by tools/prepare_gpu_check.sh (10 s): .whl/ (cp312 wheels:
# pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions, platformdirs,
# diskcache, gguf, pypdf), .gpu/lcp-slim.tar.gz (the sdist without llama.cpp's docs, models, examples
# and git history: 9 MB), .gpu/smollm2-4layers.gguf (tools/truncate_gguf.py).
# Run it as `DEADLINE_S=330 bash tools/device_gpu_check.sh`.
# The CUDA build takes 266 s of the H200 machine's 16 cores (measured 2026-12-04); it is about 135 MB
# packed, more than a call brings back, so every run builds it again.
# $OUT/gpu.txt says what passed as it happens; $OUT/tests.log and $OUT/gpu_check.txt hold the
# whole output (a run stopped at its limit still brings them back). DEADLINE_S (default 540)
# bounds the whole run: the property chunks stop there.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
began=$(date +%s)
deadline=$(( began + ${DEADLINE_S:-540} ))
repo=$(pwd)
log="$OUT/gpu.txt"
say() { echo "$*" | tee -a "$log"; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$repo
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$log"
tar xzf .gpu/lcp-slim.tar.gz -C /tmp
start=$(date +%s)
( cd /tmp/llama_cpp_python-0.3.36 && \
  CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=16 \
  python3 -m pip install -v --no-index --no-deps --no-build-isolation --target /tmp/site . ) > /tmp/build.log 2>&1
rc=$?
say "build rc=$rc in $(( $(date +%s) - start )) s"
if [ $rc -ne 0 ]; then tail -c 10000000 /tmp/build.log > "$OUT/build.log"; exit 1; fi
left() { local l=$(( deadline - $(date +%s) )); echo $(( l > 1 ? l : 1 )); }  # never 0 or less: timeout needs a positive time

# The engine on the GPU beside the CPU, in one process, and the app's start-up path.
# -X faulthandler: a crash in llama.cpp shows where Python was.
timeout 120 python3 -X faulthandler tools/gpu_check.py .gpu/smollm2-4layers.gguf --json "$OUT/gpu_check.json" \
  > "$OUT/gpu_check.txt" 2>&1
say "gpu_check rc=$?"
grep -v '^ *[0-9]*,\?$' "$OUT/gpu_check.txt" | tail -20 | tee -a "$log"
timeout 60 python3 -m chatapp ask "Hello there" --model .gpu/smollm2-4layers.gguf --json --max-tokens 16 --temperature 0 \
  --data-dir /tmp/chatapp-home 2>&1 | tail -2 | tee -a "$log"

# The machine's own pytest plugins (jaxtyping pulls in JAX's CUDA) crash llama.cpp's CUDA: load none but
# xdist and timeout. Only test files whose imports the machine has (no textual, no fastapi there).
plugins=(-p xdist.plugin -p pytest_timeout -p no:cacheprovider -o "addopts=--import-mode=importlib -ra --tb=short")
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
CHATAPP_TEST_MODEL=$repo/.gpu/smollm2-4layers.gguf timeout $(( $(left) / 4 )) python3 -m pytest -q "${plugins[@]}" -n 8 \
  tests/chatapp/engine/test_engine.py tests/chatapp/engine/test_engine_cache.py tests/chatapp/engine/test_device_turns.py \
  tests/cache 2>&1 | tee -a "$OUT/tests.log" | tail -8 | tee -a "$log"

# The tests `make test-vulkan` runs on llvmpipe, here on CUDA: one suite for both device paths.
export CHATAPP_TEST_DEVICE=cuda
device_files=(tests/chatapp/engine/test_device.py tests/chatapp/engine/test_memory_kinds.py
  tests/chatapp/engine/test_batched_answers.py)
timeout $(( $(left) / 3 )) python3 -m pytest -m device -q "${plugins[@]}" -n 8 --dist loadfile "${device_files[@]}" \
  2>&1 | tee -a "$OUT/tests.log" | tail -12 | tee -a "$log"

# Then property examples per memory kind, in chunks of new seeds, every kind at once, until the deadline:
# each chunk that passes is counted in the log as it ends.
variants=$(python3 - <<'EOF'
import os
os.environ["CHATAPP_TEST_DEVICE"] = "cuda"
from tests.chatapp.engine.test_cache_properties import VARIANTS
print(" ".join(str(variant) for variant in VARIANTS))
EOF
)
chunk() {  # VARIANT: chunks of 20 examples with seeds 20000, 20001, ... until the deadline
  local variant=$1 seed=20000
  while [ "$(left)" -gt 60 ]; do
    CHATAPP_PROPERTY_EXAMPLES=20 CHATAPP_PROPERTY_SEED=$seed timeout "$(left)" python3 -m pytest -q "${plugins[@]}" \
      "tests/chatapp/engine/test_cache_properties.py::test_cached_answers_equal_cold_answers[$variant]" \
      > "/tmp/prop-$variant-$seed.txt" 2>&1
    case $? in
      0) say "property $variant seed $seed: 20 examples passed" ;;
      124) say "property $variant seed $seed: stopped at the deadline (not counted)" ;;
      *) say "property $variant seed $seed: FAILED"; tail -60 "/tmp/prop-$variant-$seed.txt" >> "$OUT/tests.log" ;;
    esac
    seed=$(( seed + 1 ))
  done
}
for variant in $variants; do chunk "$variant" & done
wait
say "done in $(( $(date +%s) - began )) s"
