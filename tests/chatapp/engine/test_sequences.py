"""The per-sequence books: a warm-up's restore is credited once, and never outlives what it restored."""

from __future__ import annotations

import numpy as np

from chatapp.engine.handle import GenerationHandle
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.engine.sequences import SESSION_CHECKPOINTS, LiveSequence, Sequences
from chatapp.vocabulary import ReuseTier


def restored(tier: ReuseTier, tokens: int) -> LiveSequence:
    live = LiveSequence(0)
    live.replace(list(range(tokens + 10)))
    live.note_warm_restore(tier, tokens)
    return live


def test_the_next_real_request_reusing_in_place_reports_the_restored_tier_once() -> None:
    live = restored(ReuseTier.DISK, 40)
    assert live.take_credit(45, ReuseTier.DEVICE) is ReuseTier.DISK
    assert live.take_credit(45, ReuseTier.DEVICE) is ReuseTier.DEVICE


def test_a_request_that_restores_or_reuses_nothing_reports_its_own_tier() -> None:
    assert restored(ReuseTier.RAM, 40).take_credit(60, ReuseTier.DISK) is ReuseTier.DISK
    assert restored(ReuseTier.RAM, 40).take_credit(0, ReuseTier.NONE) is ReuseTier.NONE


def test_an_overwrite_clears_the_credit_and_a_cut_keeps_it_for_what_is_left() -> None:
    overwritten = restored(ReuseTier.DISK, 40)
    overwritten.replace([1, 2, 3])
    assert overwritten.take_credit(3, ReuseTier.DEVICE) is ReuseTier.DEVICE
    cut = restored(ReuseTier.DISK, 40)
    cut.truncate(20)
    assert (cut.restored_from, cut.restored_tokens) == (ReuseTier.DISK, 20)
    cut.truncate(0)
    assert cut.take_credit(5, ReuseTier.DEVICE) is ReuseTier.DEVICE


def test_a_cut_drops_later_checkpoints_and_only_the_newest_are_kept() -> None:
    live = LiveSequence(0)
    live.replace(list(range(100)))
    for position in range(10, 10 * (SESSION_CHECKPOINTS + 2), 10):
        live.keep_checkpoint(position, b"x")
    assert len(live.checkpoints) == SESSION_CHECKPOINTS
    live.truncate(55)
    assert live.checkpoint_before(100) == 50
    assert live.tokens == list(range(55))


def test_held_sequences_are_neither_matched_nor_chosen_for_others() -> None:
    sequences = Sequences(2)
    sequences[0].replace([1, 2, 3])
    mine, other = (GenerationHandle(GenerationRequest((1,), SamplingParams())) for _ in range(2))
    sequences[0].holder = other
    assert sequences.best_match(np.array([1, 2, 3], dtype=np.int32), mine) == (1, 0)
    assert sequences.least_recently_used(mine) == 1
    sequences.release(other)
    assert sequences.best_match(np.array([1, 2, 3], dtype=np.int32), mine) == (0, 3)


def test_on_a_grid_only_whole_grid_batches_from_the_start_are_reusable() -> None:
    live = LiveSequence(0, grid=4)
    live.tokens.extend(range(10))
    for start, end in ((0, 4), (4, 8), (8, 10)):  # a prompt's batches: the last one partial
        live.computed(start, end)
    assert live.reusable == 8
    live.tokens.extend(range(10, 15))  # answer tokens, one at a time: never reusable
    assert live.reusable == 8
    live.truncate(6)  # a cut inside a whole batch keeps the whole ones before it
    assert live.reusable == 4
    live.tokens.extend(range(6, 12))
    live.computed(6, 12)  # a batch that does not start where the whole ones end adds nothing
    assert live.reusable == 4
    live.replace(list(range(9)))  # a restore holds whole grid batches only
    assert live.reusable == 8


def test_without_a_grid_every_token_held_is_reusable() -> None:
    live = LiveSequence(0)
    live.replace(list(range(7)))
    live.tokens.extend(range(7, 9))
    assert live.reusable == 9


def test_a_whole_state_a_warm_up_loaded_is_credited_once_and_only_for_what_is_left() -> None:
    live = LiveSequence(0)
    live.replace(list(range(50)))
    live.note_warm_restore(ReuseTier.RAM, 40, whole_state=True)
    live.truncate(30)
    assert live.whole_state_tokens(45) == 30
    assert live.whole_state_tokens(20) == 20
    live.take_credit(30, ReuseTier.DEVICE)
    assert live.whole_state_tokens(30) == 0
    assert restored(ReuseTier.DISK, 40).whole_state_tokens(40) == 0  # assembled from blocks
