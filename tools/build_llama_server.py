"""Build llama.cpp's `llama-server` from the sources of the installed llama-cpp-python.

The benchmark (`chatapp bench`) compares chatapp with llama.cpp's own server, and the
fair comparison runs the very llama.cpp that chatapp links: the copy vendored in the
llama-cpp-python sdist of the installed version. This script downloads that sdist with
pip (pip's cache makes later runs offline), extracts it, and builds only the server
target with CMake:

    .venv/bin/python tools/build_llama_server.py [--jobs N] [--dest DIR]

The binary lands in the platform cache folder (`.../chatapp/llama-server/<version>/`),
where `chatapp.benchmark.llama_server.default_llama_server_path()` finds it. Running it
again when the binary is there only prints its path. About 7-15 minutes on two cores.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from chatapp.benchmark.llama_server import SERVER_BINARY_NAME, default_build_dir

CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
)
# llama.cpp's AMX kernels crash with SIGILL where the CPU has AMX (ggml-org/llama.cpp#26954):
# built without them, as the Makefile builds llama-cpp-python.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
X86_OPTIONS = (f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}")


def cpu_options() -> tuple[str, ...]:
    return X86_OPTIONS if platform.machine().lower() in ("x86_64", "amd64") else ()


class BuildError(Exception):
    """A one-line reason the build cannot go on."""


def say(message: str) -> None:
    print(f"build_llama_server: {message}", flush=True)


def installed_version() -> str:
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError as error:
        raise BuildError("llama-cpp-python is not installed in this Python; run `make install` first") from error


def check_tools() -> str:
    cmake = shutil.which("cmake") or _venv_tool("cmake")
    if cmake is None:
        raise BuildError("cmake not found: install CMake (or `pip install cmake` into the venv)")
    if not any(shutil.which(name) for name in ("c++", "g++", "clang++", "cl")):
        raise BuildError("no C++ compiler found (c++, g++, clang++): install one, e.g. build-essential")
    return cmake


def _venv_tool(name: str) -> str | None:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.is_file() else None


def download_sdist(version: str, work: Path) -> Path:
    sdist_dir = work / "sdist"
    existing = sorted(sdist_dir.glob(f"llama_cpp_python-{version}.tar.gz")) + sorted(
        sdist_dir.glob(f"llama-cpp-python-{version}.tar.gz")
    )
    if existing:
        say(f"sdist already here: {existing[0]}")
        return existing[0]
    sdist_dir.mkdir(parents=True, exist_ok=True)
    say(f"downloading the llama-cpp-python {version} sdist with pip (from pip's cache when it has it)")
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        f"llama-cpp-python=={version}",
        "--no-deps",
        "--no-binary",
        ":all:",
        "-d",
        str(sdist_dir),
        "-q",
    ]
    result = subprocess.run(command, check=False, capture_output=True, text=True)
    found = sorted(sdist_dir.glob("*.tar.gz"))
    if result.returncode != 0 or not found:
        tail = (result.stderr or result.stdout).strip().splitlines()
        reason = tail[-1] if tail else f"pip exited with {result.returncode}"
        raise BuildError(f"could not download the llama-cpp-python {version} sdist: {reason}")
    return found[0]


def extract(sdist: Path, work: Path, version: str) -> Path:
    target = work / "src"
    source = target / f"llama_cpp_python-{version}"
    marker = target / ".extracted"
    if marker.is_file():
        roots = [path for path in target.iterdir() if path.is_dir()]
        if roots:
            return roots[0]
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    say(f"extracting {sdist.name}")
    with tarfile.open(sdist) as archive:
        archive.extractall(target, filter="data")
    marker.write_text("ok\n")
    roots = [path for path in target.iterdir() if path.is_dir()]
    if not roots:
        raise BuildError(f"the sdist {sdist} holds no source folder")
    return roots[0] if not source.is_dir() else source


def build(cmake: str, llama_src: Path, build_dir: Path, jobs: int) -> Path:
    if not (llama_src / "CMakeLists.txt").is_file():
        raise BuildError(f"no llama.cpp sources at {llama_src}")
    say(f"configuring {llama_src} into {build_dir}")
    _run([cmake, "-S", str(llama_src), "-B", str(build_dir), *CMAKE_OPTIONS, *cpu_options()], "cmake configure")
    say(f"building target llama-server with {jobs} jobs (several minutes)")
    started = time.monotonic()
    _run(
        [cmake, "--build", str(build_dir), "--target", "llama-server", "--config", "Release", "-j", str(jobs)],
        "cmake build",
        stream=True,
    )
    say(f"compiled in {time.monotonic() - started:.0f} s")
    for candidate in (build_dir / "bin" / SERVER_BINARY_NAME, build_dir / "bin" / "Release" / SERVER_BINARY_NAME):
        if candidate.is_file():
            return candidate
    raise BuildError(f"the build finished but {SERVER_BINARY_NAME} is not under {build_dir / 'bin'}")


def _run(command: list[str], what: str, *, stream: bool = False) -> None:
    if stream:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert process.stdout is not None
        tail: list[str] = []
        for line in process.stdout:
            line = line.rstrip()
            tail = ([*tail, line])[-20:]
            if line.startswith("[") and "%]" in line[:8]:
                print(f"  {line}", flush=True)
        code = process.wait()
        output = "\n".join(tail)
    else:
        result = subprocess.run(command, check=False, capture_output=True, text=True)
        code = result.returncode
        output = (result.stdout + result.stderr).strip()
    if code != 0:
        errors = [line for line in output.splitlines() if "error" in line.lower()]
        reason = (errors or output.splitlines() or [f"exit {code}"])[-1].strip()
        raise BuildError(f"{what} failed (exit {code}): {reason}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 2, help="parallel compile jobs")
    parser.add_argument("--dest", type=Path, help="folder for the binary (default: the platform cache folder)")
    parser.add_argument("--work", type=Path, help="folder for the sdist and the build tree (default: the cache folder)")
    args = parser.parse_args(argv)
    try:
        version = installed_version()
        dest = (args.dest or default_build_dir(version)).expanduser()
        binary = dest / SERVER_BINARY_NAME
        if binary.is_file():
            say("already built")
            print(binary)
            return 0
        cmake = check_tools()
        work = (args.work or default_build_dir(version).parent / f"{version}-work").expanduser()
        say(f"llama-cpp-python {version}; work folder {work}")
        sdist = download_sdist(version, work)
        source = extract(sdist, work, version)
        built = build(cmake, source / "vendor" / "llama.cpp", work / "build", max(1, args.jobs))
        dest.mkdir(parents=True, exist_ok=True)
        partial = dest / (SERVER_BINARY_NAME + ".partial")
        shutil.copy2(built, partial)
        os.replace(partial, binary)
        say("done")
        print(binary)
        return 0
    except BuildError as error:
        print(f"build_llama_server: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("build_llama_server: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
