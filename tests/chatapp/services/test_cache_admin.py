"""What the cache screen and `cache stats` say a model's memory allows."""

from __future__ import annotations

from chatapp.services.cache_admin import _kv_type_name, describe_checks, describe_memory


def test_a_model_on_a_fixed_grid_is_said_to_reuse_whole_batches_and_a_free_one_any_token() -> None:
    assert "token-exact, and cut anywhere" in describe_memory("plain", 0, 1024)
    gridded = describe_memory("plain", 0, 1024, grid=64)
    assert "anywhere" not in gridded
    assert "fixed 64-token batches" in gridded
    window = describe_memory("iswa", 512, 1024, grid=64)
    assert window.startswith("sliding window")
    assert "512-token window" in window
    assert window.endswith("reused in whole batches")
    assert "batches" not in describe_memory("iswa", 512, 1024)


def test_each_memory_is_said_to_keep_whole_what_its_checkpoints_hold() -> None:
    hybrid = describe_memory("hybrid-iswa", 512, 1024)
    assert hybrid.startswith("sliding window + recurrent state: full-attention KV in blocks; ")
    assert "the 512-token window and the recurrent state checkpointed" in hybrid
    recurrent = describe_memory("recurrent", 0, 1024)
    assert recurrent.startswith("recurrent state: the recurrent state checkpointed")
    assert describe_memory("two-windows", 512, 1024) == "two-windows memory"  # written by a newer chatapp


def test_a_quantized_kv_type_is_named_and_f16_is_not() -> None:
    assert describe_memory("plain", 0, 1024, kv_type="q8_0").endswith("cut anywhere; KV cells in q8_0")
    assert describe_memory("iswa", 512, 1024, grid=64, kv_type="q4_0").endswith("whole batches; KV cells in q4_0")
    assert "KV cells" not in describe_memory("plain", 0, 1024)


def test_the_folders_kv_type_is_named_from_the_ggml_type_it_stored() -> None:
    assert _kv_type_name(8) == "q8_0"
    assert _kv_type_name(2) == "q4_0"
    assert _kv_type_name(1) == "f16"
    assert _kv_type_name(-1) == "f16"  # a folder written before the type was noted


def test_the_restore_checks_in_one_line() -> None:
    counts = {"checked": 0, "equal": 0, "mismatched": 0, "pending": 0, "suspended": False}
    assert describe_checks(None) is None
    assert describe_checks(counts) == "no answer that reused the cache has been checked against a cold run yet"
    counts |= {"checked": 12, "equal": 12, "pending": 1}
    assert describe_checks(counts) == (
        "so far 12 of 12 answers that reused the cache, computed again without it, had bit-identical logits "
        "(1 waiting for idle time)"
    )
    stopped = describe_checks(counts | {"equal": 11, "mismatched": 1, "suspended": True})
    assert stopped is not None
    assert stopped.startswith("REUSE STOPPED: 1 of 12 checked answers")
    assert "`chatapp cache verify --clear` resumes reuse" in stopped
