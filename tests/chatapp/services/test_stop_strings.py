"""Stop strings found across pieces, never shown in part."""

from __future__ import annotations

import pytest

from chatapp.services.stop_strings import StopMatcher


def shown(stops: tuple[str, ...], pieces: list[str]) -> tuple[str, bool]:
    matcher = StopMatcher(stops)
    released = "".join(matcher.feed(piece) for piece in pieces) + matcher.flush()
    assert released == matcher.shown
    return released, matcher.stopped


@pytest.mark.parametrize(
    ("pieces", "expected"),
    [
        (["Hello wor", "ld. END", " more"], ("Hello world. ", True)),
        (["Hello E", "N", "D"], ("Hello ", True)),  # split over three pieces
        (["Hello EN", "d"], ("Hello ENd", False)),  # a start that did not go on is released
        (["ENDgame"], ("", True)),
        (["no stop here"], ("no stop here", False)),
        (["a\n\nb"], ("a", True)),  # the earliest of several stop strings wins
    ],
)
def test_text_stops_before_the_first_stop_string(pieces: list[str], expected: tuple[str, bool]) -> None:
    assert shown(("END", "\n\n"), pieces) == expected


def test_a_held_back_start_is_not_shown_until_decided() -> None:
    matcher = StopMatcher(("STOP",))
    assert matcher.feed("go ST") == "go "
    assert matcher.feed("O") == ""
    assert matcher.feed("W") == "STOW"


def test_nothing_is_released_after_a_stop() -> None:
    matcher = StopMatcher(("x",))
    assert matcher.feed("abxcd") == "ab"
    assert matcher.feed("more") == ""
    assert matcher.flush() == ""
    assert matcher.shown == "ab"
