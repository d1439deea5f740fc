"""How llama.cpp's OpenMP threads wait, set before llama.cpp is loaded.

llama.cpp computes each graph with a team of OpenMP threads, and GCC's libgomp keeps a team for
every thread that has started one, as long as that thread lives. Once those threads outnumber
the CPUs (two engines in one process: a model pool, or a test's cold and cached engines), libgomp
spins at most 100 times at a barrier before it sleeps (its "throttled" count), and a one-token
decode, hundreds of barriers, ran at half speed or less (ea37b6c:scripts/openmp_masters.py: 38-52 against
105-111 tokens/s on 2 vCPUs). With `OMP_WAIT_POLICY=active` that count is 1,000 (or the spin count,
if lower): 88-116 tokens/s.

Where the threads do not outnumber the CPUs, libgomp spins `GOMP_SPINCOUNT` times, 300,000 by
default, and that spends a waiting thread's whole time slice on a busy machine: when more threads
want the CPUs than there are (another program computing, a second llama.cpp process), a thread
spins at a barrier while the one it waits for is not running. Measured on 2 vCPUs with a CPU burner
at 50% on each and a second chatapp process answering (2026-12-04): an 8-token `chatapp ask` took
44-48 s at 300,000 spins, 6.2-6.4 s at 30,000, 3.0 s at 10,000, 1.5 s at 1,000 and 1.4 s with
`passive` (20 s with libgomp's defaults). Idle, 10,000 spins decode as fast as 300,000 (one engine:
92-103 against 93-102 tokens/s, alternated), and `passive` a quarter slower (80-82). Idle threads
still sleep after the spinning (no CPU used by an idle engine). A spin is one `pause` instruction,
whose length differs between CPUs (Intel made it about ten times longer with Skylake; these figures
are from such a core). A wait policy the user set is kept, and with it everything; a spin count the
user set is kept beside the `active` policy. libgomp reads these once, when it loads.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

WAIT_POLICY = "OMP_WAIT_POLICY"
SPIN_COUNT = "GOMP_SPINCOUNT"
SPIN_COUNT_VALUE = "10000"  # see the module docstring: long enough idle, short enough when busy


def keep_openmp_spinning() -> None:
    """Set the waiting policy for libgomp unless the user chose one (or llama.cpp uses no libgomp); the spin
    count too, unless the user chose it (without `active`, a chosen count would bring back the two-engine
    slowdown: libgomp's throttled count is then 100)."""
    if WAIT_POLICY in os.environ or not llama_cpp_uses_libgomp():
        return
    os.environ[WAIT_POLICY] = "active"
    os.environ.setdefault(SPIN_COUNT, SPIN_COUNT_VALUE)


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
