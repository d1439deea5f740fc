"""A test's helper module run as a child process (`python -m tests.…`), for kills and processes side by side."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def start_child(module: str, *args: str, first_line: str) -> subprocess.Popen[str]:
    """`python -m module args...` from the repository's root, once it has printed `first_line`.

    Any other first line fails the test, with what the child wrote to stderr.
    """
    child = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.strip() == first_line, child.stderr.read() if child.stderr else line
    return child
