"""Streamed JSON stays one line for every client's line reader."""

from __future__ import annotations

import json

from chatapp.server.answering import event_json


def test_a_streamed_event_with_unicode_line_separators_is_one_line_and_the_same_json() -> None:
    payload = {"delta": "next\x85line\u2028and\u2029paragraph", "é": "ü"}
    written = event_json(payload)
    assert written.splitlines() == [written]  # Python's splitlines breaks at all three when they are raw
    assert json.loads(written) == payload
    assert "é" in written  # other text stays as it is (ensure_ascii off)
