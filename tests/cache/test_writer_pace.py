"""The writer's backlog: at most two states wait to be stored; a third store waits for room."""

from __future__ import annotations

import threading

from cache.writer_pace import StoreBacklog


def test_a_third_state_waits_until_one_of_two_is_stored() -> None:
    backlog = StoreBacklog(limit=2)
    backlog.enter()
    backlog.enter()
    entered = threading.Event()

    def third() -> None:
        backlog.enter()
        entered.set()

    waiting = threading.Thread(target=third)
    waiting.start()
    assert not entered.wait(0.2)  # never true while two wait (a slow machine only makes this likelier)
    assert backlog.waiting == 2
    backlog.leave()
    assert entered.wait(10)
    waiting.join()
    assert backlog.waiting == 2
