"""Memory and disk figures of a benchmark run: resident memory from /proc, bytes in a folder."""

from __future__ import annotations

import threading
from pathlib import Path


def proc_status_bytes(field: str, pid: int | str = "self") -> int | None:
    """A memory line of /proc/PID/status (VmRSS, VmHWM...) in bytes; None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith(f"{field}:"):
                    parts = line.split()
                    return int(parts[1]) * 1024 if len(parts) >= 2 and parts[1].isdigit() else None
    except OSError:
        pass
    return None


def read_rss_bytes() -> int:
    return proc_status_bytes("VmRSS") or 0


class RssSampler:
    """The highest VmRSS of this process seen between start and stop (sampled every 10 ms)."""

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.start_bytes = self.peak_bytes = read_rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-rss", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_bytes = max(self.peak_bytes, read_rss_bytes())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, read_rss_bytes())


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under `folder` (apparent size)."""
    total = 0
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total
