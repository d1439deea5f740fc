"""Which of the running requests take a step in this turn of the engine thread.

Answers being streamed take a step every turn (one token each): no prompt holds a stream
up. Prompts being computed take turns by how much of them is left: the one with the
fewest tokens left goes (shortest remaining first, which gives the lowest mean time to
first token when several clients ask at once), and each turn a prompt is passed over
counts as one batch done, so a long prompt still advances beside a run of short ones.

A request whose prompt begins with tokens another request is computing now is not
placed until the other has computed and stored them: it then restores those tokens from
the cache instead of computing them a second time (clients of one agent start together
with the same long system prompt). The other stores its KV as soon as it has computed the
shared tokens (`store_at`), not only at its prompt's end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from chatapp.engine.phases import Phase

# Shared tokens worth waiting for: fewer cost less to compute again than a store and restore.
MIN_SHARED_TOKENS = 64


@dataclass(eq=False)
class TurnState:
    """What the turn order needs to know of one running request."""

    prompt: np.ndarray
    shares_prompt: bool  # its prompt's KV goes to the cache, and it may reuse another's
    phase: Phase = Phase.PENDING
    prefill_left: int = 0  # prompt tokens still to compute, once placed
    computing_from: int = 0  # the prompt tokens it reused; it computes the rest
    passed_over: int = 0  # turns its prompt waited for another's
    store_at: int = 0  # another request waits for the KV up to here: store it once computed (0: none)
    stored_until: int = 0  # its KV was stored for a waiting request up to here


def common_prefix_length(first: np.ndarray, second: np.ndarray) -> int:
    """How many tokens two prompts share from their start."""
    length = min(first.size, second.size)
    differs = np.flatnonzero(first[:length] != second[:length])
    return int(differs[0]) if differs.size else length


def take_turns(states: Sequence[TurnState], batch: int) -> list[TurnState]:
    """The requests that take a step now, in the order given (see the module docstring).

    Sets `store_at` of each request that another waits for: it stores its KV once computed
    that far.
    """
    chosen: list[TurnState] = []
    for state in states:
        state.store_at = 0
    for state in states:
        if not state.phase.placed and _computing_for(state, states, chosen) is None:
            chosen.append(state)
    computing = [state for state in states if state.phase.placed and state.prefill_left > 0]
    if computing:
        first = min(computing, key=lambda state: state.prefill_left - state.passed_over * batch)
        for state in computing:
            state.passed_over = 0 if state is first else state.passed_over + 1
        chosen.append(first)
    chosen.extend(state for state in states if state.phase.placed and state.prefill_left <= 0)
    order = {id(state): position for position, state in enumerate(states)}
    return sorted(chosen, key=lambda state: order[id(state)])


def _computing_for(waiting: TurnState, states: Sequence[TurnState], placed_now: list[TurnState]) -> TurnState | None:
    """The request computing tokens `waiting`'s prompt begins with, if it is worth waiting for.

    One placed in this same turn has not yet said what it reuses: it counts as computing
    its whole prompt, and the wait is one turn.
    """
    if not waiting.shares_prompt:
        return None
    for other in states:
        if other is waiting or not other.shares_prompt:
            continue
        if other in placed_now:
            computing_from = 0
        elif other.phase.placed and other.prefill_left > 0:
            computing_from = other.computing_from
        else:
            continue
        shared = common_prefix_length(waiting.prompt, other.prompt)
        if shared - computing_from >= MIN_SHARED_TOKENS and other.stored_until < shared:
            other.store_at = max(other.store_at, shared)
            return other
    return None
