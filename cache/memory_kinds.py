"""One class per kind of model memory: what its sequence states hold and what may be done with them.

llama.cpp builds one of a few memories for a model (see state_format.py for their bytes):

    PlainMemory      full-attention KV (Llama, Qwen, SmolLM2): cut anywhere, no checkpoints
    WindowMemory     full-attention KV and a sliding window (Gemma 3): cut only where the
                     window before the cut is still there; restores need the window (a checkpoint)
    RecurrentMemory  a recurrent state (Mamba, RWKV): never cut, restored only at a checkpoint
    HybridMemory     an attention memory and a recurrent one side by side (LFM2, Granite-H)

The kind is chosen once, when a model loads (`memory_of`). The engine's placer, the prefix
cache and the state format ask it, and never which kind it is: a new kind (say, a model with
two window sizes) is one new class here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from cache.state_format import (
    Checkpoint,
    KVSection,
    MemoryLayout,
    ParsedState,
    StateFormatError,
    StateReader,
    checkpoint_payload,
    layout_digest,
    read_checkpoint,
    read_kv_section,
    recurrent_position,
)


class MemoryKind(StrEnum):
    """The name of a memory kind, as model listings and the cache's records spell it."""

    PLAIN = "plain"
    ISWA = "iswa"
    RECURRENT = "recurrent"
    HYBRID = "hybrid"
    HYBRID_ISWA = "hybrid-iswa"

    @classmethod
    def of(cls, *, recurrent: bool, hybrid: bool, window: int) -> MemoryKind:
        """The kind llama.cpp builds for a model with these properties."""
        if hybrid:
            return cls.HYBRID_ISWA if window > 0 else cls.HYBRID
        if recurrent:
            return cls.RECURRENT
        return cls.ISWA if window > 0 else cls.PLAIN


class Memory:
    """What a model's memory allows. The defaults are a full-attention KV cache's; each kind
    overrides what differs."""

    kind: MemoryKind = MemoryKind.PLAIN
    window: int = 0  # n_swa: tokens a sliding-window layer attends to (0: none)
    # Full-attention KV, which the cache cuts into per-block pieces.
    has_blocks: bool = True
    # A prefix restores only where a checkpoint (window, recurrent state) was taken at its end.
    restores_at_checkpoints: bool = False
    # Each token rewrites the state in place: nothing can be cut off it, only rebuilt.
    updates_in_place: bool = False
    # A cut may leave a sliding window with gaps: the window is read back and checked after it.
    checks_window_after_cut: bool = False
    # The suite checks this kind's restores bit for bit with flash attention on a CPU (plain KV: the
    # property test and the bundled model), so the app may turn it on by measurement; the kinds with
    # checkpoints are checked with it on a device only.
    flash_attention_checked: bool = True

    def read_sections(self, reader: StateReader, partial: bool) -> ParsedState:
        """The state's sections in llama.cpp's order; `partial`: read with the partial-only flag."""
        base, window = self.read_attention(reader, partial)
        return ParsedState(base, window, self.read_recurrent(reader))

    def read_attention(self, reader: StateReader, partial: bool) -> tuple[KVSection | None, KVSection | None]:
        """The full-attention section (absent from a partial state) and the window's."""
        return (None if partial else read_kv_section(reader)), None

    def read_recurrent(self, reader: StateReader) -> bytes:
        return b""

    def digest(self, layout: MemoryLayout) -> bytes:
        """16 bytes naming `layout`, stored with every entry so an entry never meets another layout."""
        return layout_digest(layout)

    def cuts_in_place(self, length: int, oldest: Callable[[], int]) -> bool:
        """Whether dropping a sequence's cells from `length` on leaves exactly its first `length`
        tokens; `oldest` reads the oldest position the sequence still holds."""
        return True

    def cut_keeps_cells(self, written: int, length: int, ring: int) -> bool:
        """Whether a sequence that held `written` tokens, cut in place to `length`, keeps its cells where a
        cold run of `length` tokens has them, in a window cache of `ring` cells (0: none)."""
        return True

    def keeps_whole_states(self) -> bool:
        """Whether a whole state may be loaded and then cut to a shorter prefix (kept ready in RAM):
        only where nothing needs a checkpoint."""
        return not self.restores_at_checkpoints

    def checkpoint_of(self, state: ParsedState) -> bytes | None:
        """The uncuttable sections of `state` as a checkpoint payload; None where there are none."""
        return None

    def check_checkpoint(self, layout: MemoryLayout, checkpoint: Checkpoint, end: int) -> None:
        """Raise StateFormatError unless `checkpoint` holds the state of a prefix of `end` tokens."""

    def checkpoint_for_restore(
        self, layout: MemoryLayout, checkpoint: bytes | memoryview | None, end: int
    ) -> Checkpoint | None:
        """The checkpoint a restore of `end` tokens loads: none for a plain memory."""
        return None

    def extends_checkpoint(self, earlier_end: int, end: int) -> bool:
        """Whether a checkpoint at `end` may be stored as the window cells it adds to one at `earlier_end`."""
        return False

    def restored_window_start(self, end: int) -> int:
        """The oldest position whose window cells a restore of `end` tokens writes from its checkpoint.

        Where a restore writes a cell for older positions too (assemble_state's window_ring),
        those are placeholders: a cut must never keep them as a window. At most this (conservative):
        a checkpoint holds at least the newest `min(end, window)` cells (check_checkpoint)."""
        return 0

    def whole_sections(self) -> tuple[str, ...]:
        """What a checkpoint keeps whole, as a user reads it (none for a plain memory)."""
        return ()


@dataclass(frozen=True)
class PlainMemory(Memory):
    """Full attention only: every cell is one token's K and V."""

    def read_sections(self, reader: StateReader, partial: bool) -> ParsedState:
        if partial:
            raise StateFormatError("a plain KV cache has no partial state")
        return super().read_sections(reader, partial)

    def digest(self, layout: MemoryLayout) -> bytes:
        # The digest plain layouts had before memory kinds existed: caches written then stay valid.
        return layout_digest(layout, legacy=layout.base is not None)


class _Checkpointed(Memory):
    """A memory with sections that cannot be cut: restores and rewinds need a checkpoint."""

    restores_at_checkpoints = True
    flash_attention_checked = False

    def cuts_in_place(self, length: int, oldest: Callable[[], int]) -> bool:
        return False

    def checkpoint_of(self, state: ParsedState) -> bytes | None:
        return checkpoint_payload(state, self.window)

    def checkpoint_for_restore(
        self, layout: MemoryLayout, checkpoint: bytes | memoryview | None, end: int
    ) -> Checkpoint | None:
        if not checkpoint:  # none, or empty
            raise StateFormatError("this model's state needs a checkpoint at the prefix's end")
        return read_checkpoint(layout, checkpoint, end)


@dataclass(frozen=True)
class WindowMemory(_Checkpointed):
    """Full attention plus layers that attend to the last `window` tokens only (interleaved SWA)."""

    window: int
    kind = MemoryKind.ISWA
    checks_window_after_cut = True

    def read_attention(self, reader: StateReader, partial: bool) -> tuple[KVSection | None, KVSection | None]:
        return (None if partial else read_kv_section(reader)), read_kv_section(reader)

    def cuts_in_place(self, length: int, oldest: Callable[[], int]) -> bool:
        # The token at `length` attends to positions from length - window + 1; llama.cpp keeps
        # (and the check after a cut asks for) one more, the `window` cells before `length`.
        if self.window <= 0:
            return False
        first = oldest()
        return 0 <= first <= max(0, length - self.window)

    def cut_keeps_cells(self, written: int, length: int, ring: int) -> bool:
        # Position p is in cell p mod ring. A cut whose freed cells run on from cell `length mod ring`
        # leaves llama.cpp writing next where a cold run does; one that frees cells past the ring's end
        # and from cell 0 on sends llama.cpp back to cell 0: the sequence is then written again.
        return ring <= 0 or length >= written or (written - 1) // ring == length // ring

    def check_checkpoint(self, layout: MemoryLayout, checkpoint: Checkpoint, end: int) -> None:
        cells, first = checkpoint.window_cells, checkpoint.first
        if cells == 0 or first + cells != end:
            raise StateFormatError(f"a checkpoint whose window ends at {first + cells}, not {end}")
        if cells < min(end, self.window):
            needed = self.window
            raise StateFormatError(f"a checkpoint whose window holds {cells} cells, fewer than the {needed} needed")

    def extends_checkpoint(self, earlier_end: int, end: int) -> bool:
        # At most half a window behind: a delta then holds at most half a window of cells.
        return 0 < end - earlier_end <= self.window // 2

    def restored_window_start(self, end: int) -> int:
        return max(0, end - self.window)

    def whole_sections(self) -> tuple[str, ...]:
        return (f"the {self.window:,}-token window",)


@dataclass(frozen=True)
class RecurrentMemory(_Checkpointed):
    """A fixed-size state per sequence that every token rewrites (Mamba, RWKV)."""

    kind = MemoryKind.RECURRENT
    has_blocks = False
    updates_in_place = True

    def read_attention(self, reader: StateReader, partial: bool) -> tuple[KVSection | None, KVSection | None]:
        return None, None

    def read_recurrent(self, reader: StateReader) -> bytes:
        recurrent = bytes(reader.take(reader.left))
        recurrent_position(recurrent)  # checks its head
        return recurrent

    def check_checkpoint(self, layout: MemoryLayout, checkpoint: Checkpoint, end: int) -> None:
        if recurrent_position(checkpoint.recurrent) != end - 1:
            raise StateFormatError(f"a checkpoint whose recurrent state is not at position {end - 1}")

    def whole_sections(self) -> tuple[str, ...]:
        return ("the recurrent state",)


@dataclass(frozen=True)
class HybridMemory(_Checkpointed):
    """Attention layers (plain or with a window) and recurrent layers, each kept by its own memory."""

    attention: PlainMemory | WindowMemory
    recurrent: RecurrentMemory = RecurrentMemory()
    updates_in_place = True

    @property
    def kind(self) -> MemoryKind:  # type: ignore[override]
        return MemoryKind.HYBRID_ISWA if self.attention.window > 0 else MemoryKind.HYBRID

    @property
    def window(self) -> int:  # type: ignore[override]
        return self.attention.window

    @property
    def checks_window_after_cut(self) -> bool:  # type: ignore[override]
        return self.attention.checks_window_after_cut

    def read_attention(self, reader: StateReader, partial: bool) -> tuple[KVSection | None, KVSection | None]:
        return self.attention.read_attention(reader, partial)

    def read_recurrent(self, reader: StateReader) -> bytes:
        return self.recurrent.read_recurrent(reader)

    def check_checkpoint(self, layout: MemoryLayout, checkpoint: Checkpoint, end: int) -> None:
        self.attention.check_checkpoint(layout, checkpoint, end)
        self.recurrent.check_checkpoint(layout, checkpoint, end)

    def extends_checkpoint(self, earlier_end: int, end: int) -> bool:
        return self.attention.extends_checkpoint(earlier_end, end)

    def cut_keeps_cells(self, written: int, length: int, ring: int) -> bool:
        return self.attention.cut_keeps_cells(written, length, ring)

    def restored_window_start(self, end: int) -> int:
        return self.attention.restored_window_start(end)

    def whole_sections(self) -> tuple[str, ...]:
        return self.attention.whole_sections() + self.recurrent.whole_sections()


def memory_of(kind: MemoryKind, window: int = 0) -> Memory:
    """The memory llama.cpp builds for a model of `kind` with a sliding window of `window` tokens."""
    made: dict[MemoryKind, Callable[[], Memory]] = {
        MemoryKind.PLAIN: PlainMemory,
        MemoryKind.ISWA: lambda: WindowMemory(window),
        MemoryKind.RECURRENT: RecurrentMemory,
        MemoryKind.HYBRID: lambda: HybridMemory(PlainMemory()),
        MemoryKind.HYBRID_ISWA: lambda: HybridMemory(WindowMemory(window)),
    }
    return made[kind]()
