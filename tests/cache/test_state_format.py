"""Cutting states into block pieces and joining them back, on synthetic states of every memory kind."""

from __future__ import annotations

import hashlib
import itertools
import random
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from cache import state_assembly
from cache.memory_kinds import MemoryKind, PlainMemory, memory_of
from cache.state_assembly import StateAssembly, StateBuffer, assemble_state
from cache.state_format import (
    CHECKPOINT_HEAD,
    KVLayout,
    MemoryLayout,
    ParsedState,
    StateFormatError,
    checkpoint_payload,
    checkpoint_tail,
    extract_piece,
    join_checkpoint,
    parse_state,
    read_checkpoint,
    recurrent_position,
    window_ring_cells,
)
from tests.cache.state_factory import (
    SyntheticModel,
    SyntheticSequence,
    has_base,
    has_recurrent,
    has_window,
    make_state,
    recurrent_section,
    small_layout,
    sorted_by_position,
    synthetic_model,
    write_state,
)

PLAIN = MemoryKind.PLAIN
CHECKPOINTED = [MemoryKind.ISWA, MemoryKind.RECURRENT, MemoryKind.HYBRID, MemoryKind.HYBRID_ISWA]
WITH_KV = [MemoryKind.ISWA, MemoryKind.HYBRID, MemoryKind.HYBRID_ISWA]


def plain(layout: KVLayout) -> MemoryLayout:
    return MemoryLayout(PlainMemory(), layout, None, 0)


def pieces_of(blob: bytes, bounds: list[int], kind: MemoryKind = PLAIN) -> list[tuple[int, bytes]]:
    """Pieces of the full-attention cells between consecutive bounds."""
    base = parse_state(blob, memory_of(kind)).base
    assert base is not None
    order, first = base.order()
    assert first == 0
    return [(end - start, extract_piece(base, order, start, end)) for start, end in itertools.pairwise(bounds)]


WINDOW = 3  # synthetic_model's default window


def checkpoint_of(blob: bytes, kind: MemoryKind, *, partial: bool = False, window: int = WINDOW) -> bytes:
    return checkpoint_payload(parse_state(blob, memory_of(kind), partial=partial), window)


# Plain KV, as before memory kinds.


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("sequence", [0, 1, 3])
def test_split_and_join_reproduces_the_state(v_trans: bool, sequence: int) -> None:
    layout = small_layout(v_trans, n_stream=4)
    blob, _ = make_state(layout, list(range(23)), seq_id=sequence, stream=sequence, seed=sequence)
    parsed = parse_state(blob, memory_of(PLAIN))
    assert parsed.layout(memory_of(PLAIN, 0)) == plain(layout)
    assert parsed.n_cells == 23
    assert parsed.swa is None
    assert parsed.recurrent == b""
    joined = assemble_state(plain(layout), pieces_of(blob, [0, 8, 16, 17, 23]), dest_seq=sequence)
    assert joined.tobytes() == blob
    assert assemble_state(plain(layout), pieces_of(blob, [0, 23]), sequence, cells=23).tobytes() == blob


def test_a_unified_cache_keeps_every_sequence_in_stream_zero() -> None:
    layout = small_layout(False, n_stream=1)
    blob, _ = make_state(layout, list(range(6)), seq_id=0, stream=0)
    moved = assemble_state(plain(layout), pieces_of(blob, [0, 3, 6]), dest_seq=5)
    expected, _ = make_state(layout, list(range(6)), seq_id=5, stream=0)
    assert moved.tobytes() == expected


@pytest.mark.parametrize("v_trans", [False, True])
def test_cells_out_of_position_order_are_sorted(v_trans: bool) -> None:
    layout = small_layout(v_trans)
    positions = [3, 0, 4, 1, 2, 6, 5]
    blob, data = make_state(layout, positions, seq_id=1, stream=1)
    joined = assemble_state(plain(layout), pieces_of(blob, [0, 2, 7]), dest_seq=1)
    assert joined.tobytes() == sorted_by_position(layout, positions, 1, 1, data)


def test_pieces_move_to_another_sequence() -> None:
    layout = small_layout(False, n_stream=3)
    blob, _ = make_state(layout, list(range(5)), seq_id=0, stream=0)
    moved = assemble_state(plain(layout), pieces_of(blob, [0, 5]), dest_seq=2)
    expected, _ = make_state(layout, list(range(5)), seq_id=2, stream=2)  # same seed: same bytes
    assert moved.tobytes() == expected


def test_a_piece_holds_only_its_cells() -> None:
    layout = small_layout(True)
    blob, data = make_state(layout, list(range(10)), seq_id=0, stream=0)
    ((count, piece),) = pieces_of(blob, [4, 6])
    assert count == 2
    assert len(piece) == layout.bytes_per_cell * 2
    first_layer_keys = np.frombuffer(piece[: 2 * layout.layers[0].k_row], dtype=np.uint8)
    assert np.array_equal(first_layer_keys, data["keys"][0][4:6].ravel())
    # Transposed V: each element row holds the two cells side by side.
    keys_size = sum(2 * layer.k_row for layer in layout.layers)
    first_values = np.frombuffer(piece[keys_size : keys_size + 2 * layout.layers[0].v_embd * 2], dtype=np.uint8)
    assert np.array_equal(first_values, data["values"][0][:, 4:6].ravel())


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("cells", [1, 3, 4, 5, 7, 8, 9, 10])
def test_assembling_fewer_cells_trims_the_last_piece(v_trans: bool, cells: int) -> None:
    """Pieces of 4, 4 and 3 cells restore any shorter prefix: as if the state had only those cells."""
    model = SyntheticModel(PLAIN, base=small_layout(v_trans))
    sequence = SyntheticSequence(model, 11, seed=cells)
    pieces = pieces_of(sequence.state(11), [0, 4, 8, 11])
    covering = pieces[: (cells + 3) // 4]  # the last of these holds more cells than needed, or exactly
    expected = sequence.state(cells)
    assert assemble_state(model.layout, covering, 0, cells=cells).tobytes() == expected
    assert assemble_state(model.layout, pieces, 0, cells=cells).tobytes() == expected  # later pieces unused
    moved = assemble_state(model.layout, covering, 1, cells=cells).tobytes()
    assert moved == sequence.state(cells, seq_id=1)


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("cells", [3, 8, 11])
@pytest.mark.parametrize("threads", [1, 3], ids=["one thread", "pieces split between threads"])
def test_uniform_layers_assemble_alike_in_a_reused_buffer(
    v_trans: bool, cells: int, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most models' layers are all alike: their fast path gives the same bytes, in reused memory too,
    and so does a copy split between threads (as large states are: 3 pieces on 3 threads here)."""
    monkeypatch.setattr(state_assembly, "PARALLEL_COPY_BYTES", 0 if threads > 1 else 1 << 40)
    monkeypatch.setattr(state_assembly, "_COPY_WORKERS", threads)
    model = SyntheticModel(PLAIN, base=small_layout(v_trans, n_layer=4, uniform=True))
    sequence = SyntheticSequence(model, 11, seed=cells)
    pieces = pieces_of(sequence.state(11), [0, 4, 8, 11])
    buffer = StateBuffer()
    first = assemble_state(model.layout, pieces, 1, cells=cells, buffer=buffer)
    assert first.tobytes() == sequence.state(cells, seq_id=1)
    again = assemble_state(model.layout, pieces[:1], 0, cells=3, buffer=buffer)
    assert again.tobytes() == sequence.state(3)
    assert np.shares_memory(first, again)  # the same memory, written again


@pytest.mark.parametrize("uniform", [False, True], ids=["layers differ", "layers alike"])
@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("cells", [4, 10, 12, 14])
def test_pieces_filled_in_any_order_on_threads_give_the_same_state(uniform: bool, v_trans: bool, cells: int) -> None:
    """A restore from disk fills each block into the state as its read ends, on the reader's thread: any order
    gives the bytes of an assembly in order, a partly used last piece and a shorter one included."""
    model = SyntheticModel(PLAIN, base=small_layout(v_trans, n_layer=4, uniform=uniform))
    sequence = SyntheticSequence(model, 14, seed=cells + uniform)
    pieces = pieces_of(sequence.state(14), [0, 3, 6, 9, 12, 14])
    assembly = StateAssembly(model.layout, [n_cells for n_cells, _ in pieces], 1, cells=cells)
    needed = list(range(assembly.pieces))
    random.Random(cells).shuffle(needed)
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda index: assembly.fill(index, np.frombuffer(pieces[index][1], np.uint8)), needed))
    if assembly.pieces < len(pieces):  # a piece past the cells asked for is not needed: ignored
        assembly.fill(len(pieces) - 1, bytes(len(pieces[-1][1])))
    assert assembly.finish().tobytes() == sequence.state(cells, seq_id=1)


def test_an_assembly_with_a_piece_missing_is_refused() -> None:
    """A block that could not be read leaves its cells unwritten: the state is never handed out."""
    model = SyntheticModel(PLAIN, base=small_layout(True))
    pieces = pieces_of(SyntheticSequence(model, 8, seed=1).state(8), [0, 4, 8])
    assembly = StateAssembly(model.layout, [4, 4], 0)
    assembly.fill(1, pieces[1][1])
    with pytest.raises(StateFormatError, match="1 of 2 pieces"):
        assembly.finish()


def test_a_state_buffer_gives_fresh_memory_past_its_limit() -> None:
    buffer = StateBuffer(max_bytes=100)
    small, large = buffer.take(80), buffer.take(200)
    assert (small.size, large.size) == (80, 200)
    assert not np.shares_memory(small, large)
    assert np.shares_memory(small, buffer.take(60))


def test_more_cells_than_the_pieces_hold_are_refused() -> None:
    layout = small_layout(False)
    blob, _ = make_state(layout, list(range(6)), seq_id=0, stream=0)
    with pytest.raises(StateFormatError, match="cannot assemble"):
        assemble_state(plain(layout), pieces_of(blob, [0, 6]), 0, cells=7)
    with pytest.raises(StateFormatError, match="cannot assemble"):
        assemble_state(plain(layout), [], 0)
    with pytest.raises(StateFormatError, match="cannot assemble"):
        assemble_state(plain(layout), pieces_of(blob, [0, 6]), 0, cells=0)


def corrupt(blob: bytes, offset: int, value: bytes) -> bytes:
    return blob[:offset] + value + blob[offset + len(value) :]


@pytest.mark.parametrize(
    "damage",
    [
        lambda blob: corrupt(blob, 0, b"\x00\x00\x00\x00"),  # magic
        lambda blob: blob[:-1],  # truncated
        lambda blob: blob + b"\x00",  # trailing bytes
        lambda blob: corrupt(blob, 20, struct.pack("<I", 2)),  # a cell shared by two sequences
        lambda blob: corrupt(blob, 8, struct.pack("<I", 0)),  # no streams
        lambda blob: corrupt(blob, 12, struct.pack("<I", 1 << 30)),  # more cells than bytes
    ],
    ids=["magic", "truncated", "trailing", "shared-cell", "no-streams", "huge-count"],
)
def test_surprises_are_format_errors(damage: Callable[[bytes], bytes]) -> None:
    layout = small_layout(False)
    blob, _ = make_state(layout, list(range(4)), seq_id=0, stream=0)
    parse_state(blob, memory_of(PLAIN))  # the undamaged state parses
    with pytest.raises(StateFormatError):
        parse_state(damage(blob), memory_of(PLAIN))


def test_cells_in_two_streams_are_refused() -> None:
    layout = small_layout(False, n_stream=2)
    blob, data = make_state(layout, [0, 1], seq_id=0, stream=0)
    second = write_state(layout, [2, 3], 0, 1, data["keys"], data["values"])
    # Stream 0's count and cells, then stream 1's count and cells instead of its zero count.
    two_streams = blob[:-4] + second[16:]
    parse_state(blob, memory_of(PLAIN))
    parse_state(second, memory_of(PLAIN))
    with pytest.raises(StateFormatError, match="two streams"):
        parse_state(two_streams, memory_of(PLAIN))


def test_gaps_in_positions_and_wrong_piece_sizes_are_refused() -> None:
    layout = small_layout(False)
    blob, _ = make_state(layout, [0, 1, 3], seq_id=0, stream=0)
    base = parse_state(blob, memory_of(PLAIN)).base
    assert base is not None
    with pytest.raises(StateFormatError, match="positions"):
        base.order()
    with pytest.raises(StateFormatError, match="piece"):
        assemble_state(plain(layout), [(2, b"\x00" * 5)], dest_seq=0)
    with pytest.raises(StateFormatError, match="outside"):
        extract_piece(base, np.arange(3), 2, 4)


def test_a_sequence_without_a_stream_is_refused() -> None:
    layout = small_layout(False, n_stream=2)
    blob, _ = make_state(layout, [0, 1], seq_id=0, stream=0)
    with pytest.raises(StateFormatError, match="no stream"):
        assemble_state(plain(layout), pieces_of(blob, [0, 2]), dest_seq=2)


def test_a_plain_cache_has_no_partial_state() -> None:
    layout = small_layout(False)
    blob, _ = make_state(layout, [0, 1], seq_id=0, stream=0)
    with pytest.raises(StateFormatError, match="partial"):
        parse_state(struct.pack("<Ii", *struct.unpack_from("<Ii", blob)), memory_of(PLAIN), partial=True)


def test_the_plain_layout_digest_is_the_one_caches_were_written_with() -> None:
    """Plain models name their layout as before memory kinds existed, so their stored caches stay valid."""
    layout = small_layout(True)
    legacy = hashlib.blake2b(repr((layout.v_trans, layout.layers)).encode(), digest_size=16).digest()
    assert plain(layout).digest() == legacy
    digests = {
        plain(layout).digest(),
        plain(small_layout(False)).digest(),
        *(synthetic_model(kind, v_trans=True).layout.digest() for kind in CHECKPOINTED),
        synthetic_model(MemoryKind.ISWA, v_trans=True, window=4).layout.digest(),
        synthetic_model(MemoryKind.HYBRID, v_trans=True, recurrent_rows=41).layout.digest(),
    }
    assert len(digests) == 8  # every layout its own


# Sliding-window, recurrent and hybrid states.

LENGTH = 11


def sequence_of(kind: MemoryKind, v_trans: bool = False, seed: int = 0, **options: int) -> SyntheticSequence:
    return SyntheticSequence(synthetic_model(kind, v_trans=v_trans, **options), LENGTH, seed=seed)


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("kind", CHECKPOINTED)
def test_each_kind_is_parsed_by_section(kind: MemoryKind, v_trans: bool) -> None:
    sequence = sequence_of(kind, v_trans)
    model = sequence.model
    parsed = parse_state(sequence.state(LENGTH, seq_id=1), memory_of(kind))
    assert parsed.layout(memory_of(kind, model.window)) == model.layout
    assert parsed.n_cells == LENGTH
    if has_base(kind):
        assert parsed.base is not None
        assert parsed.base.positions.tolist() == list(range(LENGTH))
        assert parsed.base.layout == model.base
    else:
        assert parsed.base is None
    if has_window(kind):
        assert parsed.swa is not None
        assert parsed.swa.positions.tolist() == [8, 9, 10]
        assert parsed.swa.layout == model.swa
    else:
        assert parsed.swa is None
    if has_recurrent(kind):
        assert len(parsed.recurrent) == model.recurrent_size
        assert recurrent_position(parsed.recurrent) == LENGTH - 1
        assert parsed.recurrent.endswith(sequence.recurrent[LENGTH - 1].tobytes())
    else:
        assert parsed.recurrent == b""

    partial = parse_state(sequence.partial(LENGTH, seq_id=1), memory_of(kind), partial=True)
    assert partial.base is None
    assert partial.recurrent == parsed.recurrent
    if has_window(kind):
        assert partial.swa is not None
        assert partial.swa.positions.tolist() == [8, 9, 10]


@pytest.mark.parametrize("kind", CHECKPOINTED)
def test_the_checkpoint_of_a_full_state_equals_that_of_the_partial_state(kind: MemoryKind) -> None:
    sequence = sequence_of(kind)
    for n in (1, 2, 3, 4, 7, LENGTH):
        full = checkpoint_of(sequence.state(n), kind)
        assert full == checkpoint_of(sequence.partial(n), kind, partial=True)
        assert full == checkpoint_of(sequence.partial(n, shuffle=True), kind, partial=True)  # cell order
        assert full == checkpoint_of(sequence.state(n, seq_id=1), kind)  # the sequence it was read from
        cells, first, recurrent_size = CHECKPOINT_HEAD.unpack_from(full)
        assert cells == (min(n, 3) if has_window(kind) else 0)
        assert first == (max(0, n - 3) if has_window(kind) else 0)
        assert recurrent_size == sequence.model.recurrent_size
    assert checkpoint_of(sequence.state(5), kind) != checkpoint_of(sequence.state(6), kind)


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("kind", CHECKPOINTED)
@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_pieces_and_a_checkpoint_reproduce_the_full_state(kind: MemoryKind, v_trans: bool, shuffle: bool) -> None:
    sequence = sequence_of(kind, v_trans, n_stream=4)
    layout = sequence.model.layout
    source = sequence.state(LENGTH, seq_id=1, shuffle=shuffle)
    pieces = pieces_of(source, [0, 4, 8, LENGTH], kind) if has_base(kind) else []
    checkpoint = checkpoint_of(source, kind)
    joined = assemble_state(layout, pieces, 1, cells=LENGTH, checkpoint=checkpoint)
    assert joined.tobytes() == sequence.state(LENGTH, seq_id=1)  # == source when its cells were in order
    if not shuffle:
        assert joined.tobytes() == source
    for target in (0, 3):  # every KV section moves to the target sequence's stream
        moved = assemble_state(layout, pieces, target, cells=LENGTH, checkpoint=checkpoint)
        assert moved.tobytes() == sequence.state(LENGTH, seq_id=target)
        assert parse_state(moved, memory_of(kind)).n_cells == LENGTH


@pytest.mark.parametrize("kind", [MemoryKind.ISWA, MemoryKind.HYBRID_ISWA])
def test_a_window_in_another_stream_slot_restores_into_the_sequence_stream(kind: MemoryKind) -> None:
    sequence = sequence_of(kind, n_stream=4)
    source = sequence.state(LENGTH, seq_id=1, stream=1, swa_stream=3)
    parsed = parse_state(source, memory_of(kind))
    assert parsed.swa is not None
    assert parsed.swa.positions.tolist() == [8, 9, 10]
    checkpoint = checkpoint_payload(parsed, WINDOW)
    assert checkpoint == checkpoint_of(sequence.partial(LENGTH, seq_id=2, swa_stream=0), kind, partial=True)
    joined = assemble_state(
        sequence.model.layout, pieces_of(source, [0, 8, LENGTH], kind), 2, cells=LENGTH, checkpoint=checkpoint
    )
    assert joined.tobytes() == sequence.state(LENGTH, seq_id=2)


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("kind", [MemoryKind.ISWA, MemoryKind.HYBRID_ISWA])
@pytest.mark.parametrize(
    ("ring", "positions"),
    [
        (64, list(range(LENGTH))),  # a ring longer than the prefix: position p in cell p
        (4, [8, 9, 10, LENGTH]),  # wrapped twice: the next token's cell holds its position, to be removed
        (5, [10, LENGTH, 7, 8, 9]),  # wrapped inside the window: its newest cell first
    ],
)
def test_a_window_ring_puts_every_cell_where_a_cold_run_has_it(
    kind: MemoryKind, v_trans: bool, ring: int, positions: list[int]
) -> None:
    """A cold run of LENGTH tokens leaves position p in cell p mod `ring`; a restore writes the window's
    cells there and zeros (masked placeholders) in the others."""
    sequence = sequence_of(kind, v_trans)
    source = sequence.state(LENGTH, seq_id=1)
    memory = memory_of(kind, WINDOW)
    checkpoint = checkpoint_of(source, kind)
    pieces = pieces_of(source, [0, 8, LENGTH], kind)
    layout = sequence.model.layout
    ringed = parse_state(
        assemble_state(layout, pieces, 1, cells=LENGTH, checkpoint=checkpoint, window_ring=ring), memory
    )
    plain = parse_state(assemble_state(layout, pieces, 1, cells=LENGTH, checkpoint=checkpoint), memory)
    assert ringed.swa is not None
    assert plain.swa is not None
    assert ringed.swa.positions.tolist() == positions
    assert plain.swa.positions.tolist() == [8, 9, 10]
    window = {int(p): cell for cell, p in enumerate(plain.swa.positions)}
    for cell, position in enumerate(positions):
        for layer, keys in enumerate(ringed.swa.keys):
            if position in window:  # the window's cell, as the checkpoint holds it
                assert keys[cell].tobytes() == plain.swa.keys[layer][window[position]].tobytes()
            else:  # older than the window, or the next token's: empty
                assert not keys[cell].any()
    assert ringed.base is not None
    assert plain.base is not None
    assert ringed.base.positions.tolist() == plain.base.positions.tolist() == list(range(LENGTH))
    assert ringed.recurrent == plain.recurrent


def test_a_window_ring_no_longer_than_the_window_is_refused() -> None:
    """Its cells could not hold the window and the next token's placeholder apart: never guessed."""
    with pytest.raises(StateFormatError, match="no window ring"):
        window_ring_cells(WINDOW, LENGTH, WINDOW)


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("kind", CHECKPOINTED)
@pytest.mark.parametrize("cells", [1, 2, 4, 6, 9])
def test_a_shorter_prefix_comes_from_longer_pieces_and_its_own_checkpoint(
    kind: MemoryKind, v_trans: bool, cells: int
) -> None:
    sequence = sequence_of(kind, v_trans, seed=cells)
    pieces = pieces_of(sequence.state(LENGTH), [0, 4, 8, LENGTH], kind) if has_base(kind) else []
    covering = pieces[: (cells + 3) // 4]
    checkpoint = checkpoint_of(sequence.partial(cells), kind, partial=True)
    joined = assemble_state(sequence.model.layout, covering, 0, cells=cells, checkpoint=checkpoint)
    assert joined.tobytes() == sequence.state(cells)


def test_a_window_shorter_than_the_model_window_restores() -> None:
    sequence = sequence_of(MemoryKind.ISWA, window=5)
    checkpoint = checkpoint_of(sequence.partial(2), MemoryKind.ISWA, partial=True, window=5)
    assert CHECKPOINT_HEAD.unpack_from(checkpoint) == (2, 0, 0)
    pieces = pieces_of(sequence.state(2), [0, 2], MemoryKind.ISWA)
    assert assemble_state(sequence.model.layout, pieces, 0, checkpoint=checkpoint).tobytes() == sequence.state(2)


@pytest.mark.parametrize("kind", [MemoryKind.ISWA, MemoryKind.HYBRID_ISWA])
def test_a_full_size_window_cache_keeps_only_the_window_in_a_checkpoint(kind: MemoryKind) -> None:
    """With swa_full the SWA section holds every cell; a checkpoint needs only the newest `window`."""
    full_size = sequence_of(kind, window=LENGTH, seed=4)  # same data, every cell kept
    windowed = sequence_of(kind, seed=4)
    parsed = parse_state(full_size.state(LENGTH), memory_of(kind))
    assert parsed.swa is not None
    assert parsed.swa.n_cells == LENGTH
    checkpoint = checkpoint_payload(parsed, WINDOW)
    assert CHECKPOINT_HEAD.unpack_from(checkpoint)[:2] == (WINDOW, LENGTH - WINDOW)
    assert checkpoint == checkpoint_of(windowed.state(LENGTH), kind)
    pieces = pieces_of(windowed.state(LENGTH), [0, 8, LENGTH], kind)
    joined = assemble_state(windowed.model.layout, pieces, 0, cells=LENGTH, checkpoint=checkpoint)
    assert joined.tobytes() == windowed.state(LENGTH)


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("kind", [MemoryKind.ISWA, MemoryKind.HYBRID_ISWA])
def test_a_delta_joined_to_the_checkpoint_it_extends_is_the_whole_checkpoint(kind: MemoryKind, v_trans: bool) -> None:
    sequence = sequence_of(kind, v_trans, window=8, seed=5)
    layout = sequence.model.layout

    def whole(end: int) -> bytes:
        return checkpoint_of(sequence.state(end), kind, window=8)

    for base_end, end in [(2, 5), (6, 9), (7, 11), (10, 11), (3, 11)]:
        tail = checkpoint_tail(layout, whole(end), end, end - base_end)
        assert len(tail) == len(whole(end)) - (min(end, 8) - (end - base_end)) * layout.window_bytes_per_cell
        assert join_checkpoint(layout, whole(base_end), base_end, tail, end) == whole(end)
    tail = checkpoint_tail(layout, whole(9), 9, 4)  # cells 5..8
    with pytest.raises(StateFormatError, match="does not extend"):
        join_checkpoint(layout, whole(6), 6, tail, 9)  # from 5, not 6
    with pytest.raises(StateFormatError, match="no tail"):
        checkpoint_tail(layout, whole(9), 9, 9)  # more cells than the window holds


@pytest.mark.parametrize("kind", [MemoryKind.ISWA, MemoryKind.HYBRID_ISWA])
def test_a_checkpoint_with_less_than_the_window_is_refused(kind: MemoryKind) -> None:
    sequence = sequence_of(kind)
    short = checkpoint_of(sequence.state(6), kind, window=WINDOW - 1)  # cells 4 and 5 only
    with pytest.raises(StateFormatError, match="fewer than"):
        read_checkpoint(sequence.model.layout, short, 6)
    assert read_checkpoint(sequence.model.layout, checkpoint_of(sequence.state(2), kind), 2).window_cells == 2


@pytest.mark.parametrize("kind", CHECKPOINTED)
def test_a_missing_checkpoint_is_refused(kind: MemoryKind) -> None:
    sequence = sequence_of(kind)
    pieces = pieces_of(sequence.state(LENGTH), [0, LENGTH], kind) if has_base(kind) else []
    for missing in (None, b""):
        with pytest.raises(StateFormatError, match="needs a checkpoint"):
            assemble_state(sequence.model.layout, pieces, 0, cells=LENGTH, checkpoint=missing)


@pytest.mark.parametrize("kind", CHECKPOINTED)
def test_a_checkpoint_at_another_position_is_refused(kind: MemoryKind) -> None:
    sequence = sequence_of(kind)
    layout = sequence.model.layout
    checkpoint = checkpoint_of(sequence.state(6), kind)
    assert read_checkpoint(layout, checkpoint, 6).first == (3 if has_window(kind) else 0)
    pieces = pieces_of(sequence.state(LENGTH), [0, LENGTH], kind) if has_base(kind) else []
    for end in (5, 7):
        expected = "window ends" if has_window(kind) else "recurrent state is not at"
        with pytest.raises(StateFormatError, match=expected):
            read_checkpoint(layout, checkpoint, end)
        with pytest.raises(StateFormatError, match=expected):
            assemble_state(layout, pieces, 0, cells=end, checkpoint=checkpoint)


def test_a_window_and_a_recurrent_state_of_different_positions_are_refused() -> None:
    kind = MemoryKind.HYBRID_ISWA
    sequence = sequence_of(kind)
    at_six, at_five = parse_state(sequence.state(6), memory_of(kind)), parse_state(sequence.state(5), memory_of(kind))
    mixed = checkpoint_payload(ParsedState(None, at_six.swa, at_five.recurrent), WINDOW)
    with pytest.raises(StateFormatError, match="recurrent state is not at position 5"):
        read_checkpoint(sequence.model.layout, mixed, 6)
    mixed = checkpoint_payload(ParsedState(None, at_five.swa, at_six.recurrent), WINDOW)
    with pytest.raises(StateFormatError, match="window ends at 5"):
        read_checkpoint(sequence.model.layout, mixed, 6)


@pytest.mark.parametrize("kind", CHECKPOINTED)
def test_a_checkpoint_of_the_wrong_size_is_refused(kind: MemoryKind) -> None:
    sequence = sequence_of(kind)
    layout = sequence.model.layout
    checkpoint = checkpoint_of(sequence.state(6), kind)
    for damaged in (checkpoint[:-1], checkpoint + b"\x00", checkpoint[: CHECKPOINT_HEAD.size - 1]):
        with pytest.raises(StateFormatError, match=r"wrong size|without its head"):
            read_checkpoint(layout, damaged, 6)
    if has_recurrent(kind):  # another model's recurrent state: consistent in itself, but not this size
        other = sequence_of(kind, recurrent_rows=48)
        with pytest.raises(StateFormatError, match="another size"):
            read_checkpoint(layout, checkpoint_of(other.state(6), kind), 6)
    if has_window(kind):  # a window of another model's layers
        other = sequence_of(kind, scale=2)
        with pytest.raises(StateFormatError, match="wrong size"):
            read_checkpoint(layout, checkpoint_of(other.state(6), kind), 6)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (recurrent_section(3, 2, b"x" * 40, cell_count=2), "2 cells"),
        (recurrent_section(3, 2, b"x" * 40, n_seq_id=1), "does not know"),
        (recurrent_section(-2, 2, b"x" * 40), "does not know"),
        (recurrent_section(3, 0, b"x" * 40), "does not know"),
        (b"\x01\x00", "without its cell count"),
        (recurrent_section(3, 2, b"")[:-4], "1 cells"),
    ],
    ids=["two-cells", "seq-ids", "negative-position", "no-layers", "no-count", "short-head"],
)
def test_surprising_recurrent_sections_are_refused(section: bytes, message: str) -> None:
    kind = MemoryKind.RECURRENT
    good = sequence_of(kind).state(4)
    parse_state(good, memory_of(kind))
    with pytest.raises(StateFormatError, match=message):
        parse_state(good[:8] + section, memory_of(kind))


@pytest.mark.parametrize("kind", CHECKPOINTED)
def test_surprises_in_other_kinds_are_format_errors(kind: MemoryKind) -> None:
    sequence = sequence_of(kind)
    full, partial = sequence.state(6), sequence.partial(6)
    with pytest.raises(StateFormatError, match="magic"):
        parse_state(corrupt(full, 0, b"\x00\x00\x00\x00"), memory_of(kind))
    for blob, is_partial in ((full, False), (partial, True)):
        for damaged in (blob[:-1], blob + b"\x00"):
            if has_recurrent(kind):
                # The recurrent section is opaque bytes to the end: its size gives the damage away.
                parsed = parse_state(damaged, memory_of(kind), partial=is_partial)
                assert len(parsed.recurrent) != sequence.model.recurrent_size
                if not is_partial:
                    assert parsed.layout(memory_of(kind, sequence.model.window)) != sequence.model.layout
            else:
                with pytest.raises(StateFormatError):
                    parse_state(damaged, memory_of(kind), partial=is_partial)
    if kind is MemoryKind.ISWA:  # one KV section where two are expected, and the other way round
        with pytest.raises(StateFormatError):
            parse_state(partial, memory_of(kind))
        with pytest.raises(StateFormatError):
            parse_state(full, memory_of(kind), partial=True)
    if has_recurrent(kind) and has_base(kind):  # a state without its recurrent section
        with pytest.raises(StateFormatError):
            parse_state(full[: len(full) - sequence.model.recurrent_size], memory_of(kind))


def test_an_empty_recurrent_sequence_holds_nothing() -> None:
    sequence = sequence_of(MemoryKind.RECURRENT)
    parsed = parse_state(sequence.state(0), memory_of(MemoryKind.RECURRENT))
    assert parsed.n_cells == 0
    assert recurrent_position(parsed.recurrent) == -1
