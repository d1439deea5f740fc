"""Stop strings: end an answer where one appears, without ever showing any of it.

The engine knows only token limits and end-of-generation tokens; API clients also name
strings that end the answer (`stop`). A stop string may arrive split across tokens, so the
text that could still be the start of one is held back until the next piece decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StopMatcher:
    """Feed answer text piece by piece; read what may be shown, and whether a stop string ended it."""

    stops: tuple[str, ...]
    stopped: bool = False
    matched: int | None = None  # which of `stops` ended the answer (its place in the list)
    shown: str = ""  # everything released so far (the final answer once stopped)
    _held: str = field(default="", repr=False)

    def feed(self, text: str) -> str:
        """Add `text`; return the part that can be shown now (nothing more once stopped)."""
        if self.stopped or not text:
            return ""
        pending = self._held + text
        cut, self.matched = self._first_stop(pending)
        if cut is not None:
            self.stopped = True
            self._held = ""
            return self._release(pending[:cut])
        keep = self._open_suffix_length(pending)
        self._held = pending[len(pending) - keep :] if keep else ""
        return self._release(pending[: len(pending) - keep])

    def flush(self) -> str:
        """The answer ended without a stop string: release what was held back."""
        held, self._held = self._held, ""
        return "" if self.stopped else self._release(held)

    def _release(self, text: str) -> str:
        self.shown += text
        return text

    def _first_stop(self, text: str) -> tuple[int | None, int | None]:
        """Where the first stop string in `text` begins, and which it is (the first listed of those there)."""
        found = [(index, number) for number, stop in enumerate(self.stops) if (index := text.find(stop)) >= 0]
        return min(found) if found else (None, None)

    def _open_suffix_length(self, text: str) -> int:
        """The longest end of `text` that is the beginning of a stop string."""
        longest = 0
        for stop in self.stops:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
