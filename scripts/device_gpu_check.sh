#!/usr/bin/env bash
# The GPU check as run on the lent GPU machine (no network there): install carried wheels,
# build llama-cpp-python with CUDA from a slimmed sdist, then run the checks.
# Carried (ignored) paths: .whl/ (cp312 wheels: pydantic, pydantic-core, annotated-types,
# typing-inspection, typing-extensions, platformdirs, diskcache), .gpu/lcp-slim.tar.gz, .gpu/smollm2-4layers.gguf.
# The CUDA build (about 4 minutes of device time) comes back in $OUT as llama-cuda.tgz.part-*;
# put those parts in .gpu/ and the next run unpacks them instead of building.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
repo=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$repo
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
if ls .gpu/llama-cuda.tgz.part-* >/dev/null 2>&1; then
  cat .gpu/llama-cuda.tgz.part-* | tar xzf - -C /tmp/site && echo "prebuilt CUDA llama-cpp-python unpacked" | tee -a "$OUT/gpu.txt"
else
  tar xzf .gpu/lcp-slim.tar.gz -C /tmp
  start=$(date +%s)
  ( cd /tmp/llama_cpp_python-0.3.36 && \
    CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=16 \
    python3 -m pip install -v --no-index --no-deps --no-build-isolation --target /tmp/build-site . ) > /tmp/build.log 2>&1
  rc=$?
  echo "build rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu.txt"
  tail -3 /tmp/build.log
  if [ $rc -ne 0 ]; then cp /tmp/build.log "$OUT/build.log"; exit 1; fi
  ( cd /tmp/build-site && tar czf - llama_cpp llama_cpp_python-*.dist-info ) | split -b 15M - "$OUT/llama-cuda.tgz.part-"
  cp -r /tmp/build-site/. /tmp/site/
fi
python3 scripts/gpu_check.py .gpu/smollm2-4layers.gguf --json "$OUT/gpu_check.json" > "$OUT/gpu_check.txt" 2>&1
echo "gpu_check rc=$?" | tee -a "$OUT/gpu.txt"
grep -v '^ *[0-9]*,\?$' "$OUT/gpu_check.txt" | tail -60
python3 -m chatapp ask "Hello there" --model .gpu/smollm2-4layers.gguf --json --max-tokens 16 --temperature 0 --data-dir /tmp/chatapp-home 2>&1 | tail -2 | tee -a "$OUT/gpu.txt"
# The machine's own pytest plugins (jaxtyping pulls in JAX's CUDA) crash llama.cpp's CUDA: load none.
CHATAPP_TEST_MODEL=$repo/.gpu/smollm2-4layers.gguf PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python3 -m pytest tests/chatapp/engine/test_engine.py tests/chatapp/engine/test_engine_cache.py tests/cache -q -p no:cacheprovider -o addopts="--import-mode=importlib" 2>&1 | tail -8 | tee -a "$OUT/gpu.txt"
# The tests `make test-vulkan` runs on llvmpipe, here on CUDA: one suite for both device paths
# (needs hypothesis among the carried wheels).
CHATAPP_TEST_DEVICE=cuda PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 CHATAPP_PROPERTY_EXAMPLES=200 python3 -m pytest -m device -q -p no:cacheprovider -o addopts="--import-mode=importlib -ra" 2>&1 | tail -12 | tee -a "$OUT/gpu.txt"
