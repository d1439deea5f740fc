#!/usr/bin/env bash
# Make here what tools/device_gpu_check.sh needs on the lent GPU machine, which has no network:
#   .whl/  wheels of chatapp's pure dependencies for that machine's Python (3.12 by default), at the
#          versions this checkout's .venv tests with (pydantic-core must match pydantic);
#   .gpu/lcp-slim.tar.gz  the pinned llama-cpp-python sdist without git history, docs, web UI,
#          examples, benches and vocabulary models (77 MB -> about 9 MB: a call carries 64 MiB in all);
#   .gpu/smollm2-4layers.gguf  the bundled model cut to 4 layers (tools/truncate_gguf.py).
# Both folders are ignored by git. Then, where `device` lends a GPU:
#   run: DEADLINE_S=330 bash tools/device_gpu_check.sh   carry: [".whl", ".gpu"]   timeout_s: 360
# Usage: tools/prepare_gpu_check.sh [PYTHON_VERSION]   (needs `make install` and the package registry)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
TARGET_PYTHON=${1:-3.12}
PIN=$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)
VERSION=${PIN#llama-cpp-python==}
say() { echo "prepare_gpu_check: $*"; }

mapfile -t wheels < <("$PY" - <<'EOF'
from importlib.metadata import version
for name in ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
             "platformdirs", "diskcache", "gguf", "pypdf"):
    print(f"{name}=={version(name)}")
EOF
)
rm -rf .whl && mkdir -p .whl
say "wheels for Python $TARGET_PYTHON: ${wheels[*]}"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$TARGET_PYTHON" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .whl "${wheels[@]}"

mkdir -p .gpu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say "slimming the llama-cpp-python $VERSION sdist"
"$PY" -m pip download -q --no-deps --no-binary :all: -d "$work" "$PIN"
tar xzf "$work"/llama_cpp_python-"$VERSION".tar.gz -C "$work"
source_dir=$work/llama_cpp_python-$VERSION
vendor=$source_dir/vendor/llama.cpp
rm -rf "$source_dir/.git" "$source_dir/examples" "$vendor/.git" "$vendor/tools/ui" "$vendor/docs" \
    "$vendor/benches" "$vendor/media" "$vendor/gguf-py/tests"
find "$vendor/models" -name '*.gguf' -size +100k -delete
tar czf .gpu/lcp-slim.tar.gz -C "$work" "llama_cpp_python-$VERSION"

bundled=$("$PY" -c 'from chatapp.model_files import bundled_model_path; print(bundled_model_path())')
"$PY" tools/truncate_gguf.py "$bundled" .gpu/smollm2-4layers.gguf --layers 4
say "done: $(du -sh .whl | cut -f1) of wheels, $(du -h .gpu/lcp-slim.tar.gz | cut -f1) sdist, $(du -h .gpu/smollm2-4layers.gguf | cut -f1) model"
