"""How llama.cpp's OpenMP threads wait, set before llama.cpp is loaded.

llama.cpp computes each graph with a team of OpenMP threads, and GCC's libgomp keeps a team for
every thread that has started one, as long as that thread lives. Once those threads outnumber
the CPUs (two engines in one process: a model pool, or a test's cold and cached engines), libgomp
spins at most 1,000 times at a barrier before it sleeps, and a one-token decode, hundreds of
barriers, ran at half speed or less (scripts/openmp_masters.py: 52 against 105-110 tokens/s on
2 vCPUs). `OMP_WAIT_POLICY=active` with libgomp's own default spin count (`GOMP_SPINCOUNT=300000`)
makes it spin as long in that case as it does with one team, and no longer: idle threads still
sleep after it (measured: no CPU used by an idle engine). libgomp reads these once, when it loads.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

WAIT_POLICY = "OMP_WAIT_POLICY"
SPIN_COUNT = "GOMP_SPINCOUNT"
LIBGOMP_DEFAULT_SPIN_COUNT = "300000"


def keep_openmp_spinning() -> None:
    """Set the waiting policy for libgomp unless the user chose one (or llama.cpp uses no libgomp)."""
    if WAIT_POLICY in os.environ or SPIN_COUNT in os.environ or not llama_cpp_uses_libgomp():
        return
    os.environ[WAIT_POLICY] = "active"
    os.environ[SPIN_COUNT] = LIBGOMP_DEFAULT_SPIN_COUNT


def llama_cpp_uses_libgomp() -> bool:
    """Whether the installed llama.cpp CPU library links GCC's OpenMP (LLVM's reads the policy otherwise:
    there `active` would keep idle threads spinning)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return False
    library = next(iter(sorted((Path(spec.origin).parent / "lib").glob("libggml-cpu*.so*"))), None)
    try:
        return library is not None and b"libgomp.so" in library.read_bytes()
    except OSError:
        return False
