"""The words under an answer and in the status line, for every way a cache can answer (or not say)."""

from __future__ import annotations

from chatapp.tui.format import reuse_text, speed_fields
from chatapp.vocabulary import ReuseTier


def test_reuse_is_named_with_its_tier() -> None:
    stats = {"reused_tokens": 2000, "prompt_tokens": 2210, "reuse_tier": ReuseTier.SERVER.value, "ttft_ms": 150}
    assert reuse_text(stats) == "reused 2,000 of 2,210 prompt tokens from the server's cache"
    assert speed_fields(stats)[-1] == "cache 2,000/2,210 from server"
    nothing = {**stats, "reused_tokens": 0, "reuse_tier": ReuseTier.NONE.value}
    assert reuse_text(nothing) == "reused 0 of 2,210 prompt tokens"


def test_a_server_that_does_not_say_what_it_reused_is_not_said_to_have_reused_nothing() -> None:
    stats = {"reused_tokens": 0, "prompt_tokens": 138, "reuse_tier": ReuseTier.UNREPORTED.value, "ttft_ms": 90}
    assert reuse_text(stats) == "138 prompt tokens; the server does not say what it reused"
    assert speed_fields(stats)[-1] == "cache not reported"
