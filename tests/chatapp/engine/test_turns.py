"""The turn order of running requests: streams every turn, prompts shortest-left first, shared prefixes once."""

from __future__ import annotations

import numpy as np

from chatapp.engine.phases import Phase
from chatapp.engine.turns import MIN_SHARED_TOKENS, TurnState, common_prefix_length, take_turns

BATCH = 8


def computing(left: int, prompt: np.ndarray | None = None, computing_from: int = 0) -> TurnState:
    tokens = prompt if prompt is not None else np.arange(left, dtype=np.int32)
    return TurnState(tokens, True, Phase.PREFILLING, prefill_left=left, computing_from=computing_from)


def test_common_prefix_length() -> None:
    assert common_prefix_length(np.array([1, 2, 3]), np.array([1, 2, 4, 5])) == 2
    assert common_prefix_length(np.array([1, 2]), np.array([1, 2, 3])) == 2
    assert common_prefix_length(np.array([9]), np.array([1])) == 0


def test_streams_step_every_turn_and_one_prompt_at_a_time() -> None:
    streaming = computing(0)
    long, short = computing(400), computing(40)
    assert take_turns([streaming, long, short], BATCH) == [streaming, short]


def test_a_long_prompt_still_advances_beside_short_ones() -> None:
    long = computing(100)
    turns_until_long = 0
    while True:
        short = computing(40)  # a new short prompt every turn
        chosen = take_turns([long, short], BATCH)
        turns_until_long += 1
        if long in chosen:
            break
        assert turns_until_long < 20
    assert turns_until_long == 9  # passed over until 100 - 8 * turns < 40


def test_a_request_waits_for_the_shared_beginning_another_computes() -> None:
    shared = np.arange(500, dtype=np.int32)
    other = computing(300, np.concatenate([shared, [7, 8]]).astype(np.int32), computing_from=200)
    waiting = TurnState(np.concatenate([shared, [9]]).astype(np.int32), True)
    assert take_turns([other, waiting], BATCH) == [other]
    assert other.store_at == 500  # store once the shared tokens are computed
    other.stored_until = 512  # computed past them and stored: the waiting one is placed now
    assert take_turns([other, waiting], BATCH) == [other, waiting]
    assert other.store_at == 0
    other.stored_until, other.prefill_left = 0, 0  # or the other's prompt is done


def test_no_wait_for_a_few_shared_tokens_or_a_prompt_kept_out_of_the_cache() -> None:
    shared = np.arange(500, dtype=np.int32)
    mostly_reused = computing(
        20, np.concatenate([shared, [7]]).astype(np.int32), computing_from=500 - MIN_SHARED_TOKENS + 1
    )
    waiting = TurnState(np.concatenate([shared, [9]]).astype(np.int32), True)
    assert waiting in take_turns([mostly_reused, waiting], BATCH)
    not_stored = TurnState(np.concatenate([shared, [7]]).astype(np.int32), False, Phase.PREFILLING, prefill_left=300)
    assert waiting in take_turns([not_stored, waiting], BATCH)


def test_requests_arriving_together_place_one_first() -> None:
    prompt = np.arange(500, dtype=np.int32)
    first, second = TurnState(prompt, True), TurnState(prompt.copy(), True)
    assert take_turns([first, second], BATCH) == [first]
