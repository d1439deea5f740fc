"""`chatapp ask`: the JSON contract, streaming to stdout, and one-line errors with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chatapp import cli
from chatapp.cli import main
from chatapp.documents import load_document
from chatapp.engine.engine import Engine
from chatapp.engine.llama_native import offload_device
from chatapp.model_files import bundled_model_path
from chatapp.services.conversation import Conversation
from chatapp.services.library import open_library
from chatapp.services.startup import open_workspace
from tests.model_factory import write_tiny_llama
from tests.pdf_factory import write_pdf

JSON_FIELDS = {
    "answer": str,
    "prompt_tokens": int,
    "reused_tokens": int,
    "computed_tokens": int,
    "reuse_tier": str,
    "ttft_ms": float,
    "total_ms": float,
    "generated_tokens": int,
    "model": str,
    "model_fingerprint": str,
    "device": str,
    "kv_type": str,
}
QUICK = ["--max-tokens", "8", "--temperature", "0", "--context", "1024"]


def ask_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[dict[str, Any], str]:
    assert main(["ask", *args, *QUICK, "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    return json.loads(lines[-1]), "\n".join(lines[:-1])


def test_ask_json_has_every_field(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record, streamed = ask_json(capsys, "What is the capital of France?")
    for name, kind in JSON_FIELDS.items():
        assert isinstance(record[name], kind), name
    assert streamed == record["answer"] != ""
    assert record["reused_tokens"] + record["computed_tokens"] == record["prompt_tokens"]
    assert record["reuse_tier"] == "none"
    assert record["reused_tokens"] == 0
    # At most --max-tokens: whether this answer ends by itself before 8 differs between CPUs.
    assert 0 < record["generated_tokens"] <= 8
    assert record["model"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert record["model_fingerprint"].startswith("xxh3-128:")
    assert record["device"] == (offload_device() or "CPU")  # this build offloads every layer where it can
    assert record["kv_type"] == "f16"


def test_kv_type_reaches_the_engine(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record, _ = ask_json(capsys, "Name a colour.", "--kv-type", "q4_0")
    assert record["kv_type"] == "q4_0"
    assert record["reused_tokens"] + record["computed_tokens"] == record["prompt_tokens"]


def test_an_unknown_kv_type_is_refused_in_one_line(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["ask", "Hi.", "--kv-type", "q9"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'q9'" in capsys.readouterr().err


def test_a_second_question_about_a_document_reuses_it_from_disk(
    data_dir: Path, tmp_path: Path, capsys, engine: Engine
) -> None:
    """The document sits after the persona and before the question: a new process reuses every token of it."""
    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\n\nThe launch is on Tuesday at 10:00 in room 4.\n" * 12, encoding="utf-8")
    questions = ["When is the launch?", "Which room?"]
    first, _ = ask_json(capsys, questions[0], "--system", "Be brief.", "--doc", str(doc))
    second, _ = ask_json(capsys, questions[1], "--system", "Be brief.", "--doc", str(doc))
    prompts = []
    for question in questions:
        conversation = Conversation(system_prompt="Be brief.", document=load_document(doc))
        conversation.add_user(question)
        prompts.append(engine.prompt_builder.build(conversation.prompt_messages()))
    shared = next(index for index, (a, b) in enumerate(zip(*prompts, strict=False)) if a != b)
    assert shared > 250  # persona and document
    assert first["reuse_tier"] == "none"
    assert second["reuse_tier"] == "disk"
    assert second["reused_tokens"] == shared


def test_system_prompt_from_file_and_pdf_document(data_dir: Path, tmp_path: Path, capsys) -> None:
    persona = tmp_path / "persona.txt"
    persona.write_text("You are a pirate.\n", encoding="utf-8")
    pdf = write_pdf(tmp_path / "map.pdf", ["The treasure is under the old oak."])
    with_pdf, _ = ask_json(capsys, "Where is the treasure?", "--system-file", str(persona), "--doc", str(pdf))
    without, _ = ask_json(capsys, "Where is the treasure?", "--system-file", str(persona))
    assert with_pdf["prompt_tokens"] > without["prompt_tokens"] + 8


def test_no_cache_computes_everything(data_dir: Path, capsys) -> None:
    record, _ = ask_json(capsys, "Hello", "--no-cache")
    assert record["computed_tokens"] == record["prompt_tokens"]
    assert record["reuse_tier"] == "none"


def expect_error(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("chatapp: error: ")
    assert message in error
    assert error.count("\n") == 1  # one line, no traceback


def test_errors_are_one_line_with_exit_code_2(data_dir: Path, tmp_path: Path, capsys) -> None:
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_text("plain text")
    empty_doc = tmp_path / "empty.txt"
    empty_doc.write_text("")
    long_doc = tmp_path / "long.txt"
    long_doc.write_text("All work and no play makes Jack a dull boy. " * 200)
    expect_error(capsys, ["ask", "hi", "--model", str(tmp_path / "none.gguf")], "does not exist")
    expect_error(capsys, ["ask", "hi", "--model", str(not_gguf)], "not a GGUF model file")
    expect_error(capsys, ["ask", "hi", "--doc", str(tmp_path / "none.txt")], "does not exist")
    expect_error(capsys, ["ask", "hi", "--doc", str(empty_doc)], "is empty")
    expect_error(capsys, ["ask", "hi", "--system-file", str(tmp_path / "none.txt")], "does not exist")
    expect_error(
        capsys,
        ["ask", "hi", "--doc", str(long_doc), "--context", "512"],
        "but a conversation's context holds 512; use a shorter document",
    )
    expect_error(capsys, ["ask", "hi", "--temperature", "-1"], "temperature")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(bundled_model_path().read_bytes()[:300_000])
    expect_error(capsys, ["ask", "hi", "--model", str(tmp_path)], "is a folder")
    expect_error(capsys, ["ask", "hi", "--model", str(truncated)], "truncated.gguf")


def test_bad_settings_file_is_reported(data_dir: Path, capsys) -> None:
    data_dir.mkdir(parents=True)
    (data_dir / "config.toml").write_text("sequences = 0\n")
    expect_error(capsys, ["ask", "hi"], "sequences: Input should be greater than or equal to 1")
    for budget in ("cache_ram_mib", "cache_disk_mib"):
        (data_dir / "config.toml").write_text(f"{budget} = -5\n")
        expect_error(capsys, ["cache", "stats"], f"{budget}: Input should be greater than or equal to")
    (data_dir / "config.toml").write_text("no_such_setting = 1\n")
    expect_error(capsys, ["cache", "stats"], "no_such_setting")


def test_a_data_folder_without_write_permission_is_one_line(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    data_dir.mkdir(parents=True)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == data_dir else real_access(path, mode))
    expect_error(capsys, ["cache", "stats"], "is not writable; fix its permissions or choose another with --data-dir")


def test_an_unexpected_failure_is_one_line_not_a_traceback(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("something nobody foresaw")

    monkeypatch.setattr(cli, "cache_stats", broken)
    assert cli.main(["cache", "stats"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "something nobody foresaw" in err
    assert "Traceback" not in err


def test_installed_command_streams_and_prints_json(tmp_path: Path) -> None:
    """The real entry point in a fresh process, as benchmarks call it."""
    chatapp = Path(sys.executable).parent / "chatapp"
    command = [str(chatapp), "ask", "What is the capital of France?", "--json", *QUICK]
    env = {**os.environ, "CHATAPP_HOME": str(tmp_path / "home")}
    finished = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert finished.stderr == ""  # llama.cpp's log never reaches the terminal
    record = json.loads(finished.stdout.splitlines()[-1])
    assert finished.stdout.startswith(record["answer"])
    assert (tmp_path / "home" / "cache").is_dir()


def test_cache_stats_prune_and_clear(data_dir: Path, capsys) -> None:
    ask_json(capsys, "Name a colour.", "--system", "You answer in one word.")
    ask_json(capsys, "Name a fruit.", "--system", "You answer in one word.")
    assert main(["cache", "stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["requests"] == 2
    assert stats["reused_tokens"] > 0
    assert stats["reused_by_tier"]["disk"] == stats["reused_tokens"]
    assert 0 < stats["hit_rate"] < 1
    assert stats["disk"]["entries"] >= 1
    assert stats["disk"]["bytes"] > 0
    assert stats["disk"]["hits"] >= 1
    assert stats["ram"]["budget_bytes"] == 2048 << 20
    assert stats["ram"]["eviction_policy"] == "value"
    assert stats["memory"]["kind"] == "plain"  # the bundled model's memory, noted by the cache
    assert main(["cache", "stats"]) == 0
    report = capsys.readouterr().out
    assert "hit rate" in report
    assert "memory of the last model used: plain KV cache" in report
    assert main(["cache", "prune"]) == 0
    assert "pruned 0 expired entries" in capsys.readouterr().out
    library = open_library(open_workspace(str(data_dir)))
    library.pins.add("persona", "one word", [1, 2, 3])
    library.close()
    orphan = data_dir / "cache" / "kv" / "blocks" / "00" / "00" / "left-by-a-crash.val"
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"kv" * 30_000)
    assert main(["cache", "clear"]) == 0
    assert "removed" in capsys.readouterr().out
    assert main(["cache", "stats", "--json"]) == 0
    cleared = json.loads(capsys.readouterr().out)
    assert cleared["disk"]["entries"] == 0
    assert cleared["requests"] == 0
    assert cleared["memory"]["description"] == "no model has used this cache folder yet"
    assert not list((data_dir / "cache" / "kv").rglob("*.val"))
    library = open_library(open_workspace(str(data_dir)))
    assert library.pins.list() == []
    library.close()


def test_cache_verify_checks_the_restore_ask_left_sampled(data_dir: Path, capsys) -> None:
    """`ask` ends right after its answer, mostly before the idle time the check would take: the sample waits."""
    ask_json(capsys, "Name a colour.", "--system", "You answer in one word.")
    second, _ = ask_json(capsys, "Name a fruit.", "--system", "You answer in one word.")
    assert second["reuse_tier"] == "disk"
    assert main(["cache", "stats", "--json"]) == 0
    sampled = json.loads(capsys.readouterr().out)["checks"]  # the session's first reuse, checked or waiting
    assert sampled["pending"] + sampled["checked"] == 1
    assert main(["cache", "verify", "--context", "1024"]) == 0
    report = capsys.readouterr().out
    if sampled["pending"]:
        assert "checked 1 prompt that reuse cached KV (disk 1): 1 bit-identical to a cold run" in report
    assert "1 of 1 checked so far were equal" in report
    assert main(["cache", "stats", "--json"]) == 0
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert checks == {"checked": 1, "equal": 1, "mismatched": 0, "pending": 0, "suspended": False}
    assert main(["cache", "verify", "--context", "1024"]) == 0
    assert "no sampled prompt waits to be checked; 1 of 1 checked so far were equal" in capsys.readouterr().out
    assert main(["cache", "verify", "--clear"]) == 0
    assert "reuse resumed for 0 stopped models" in capsys.readouterr().out
    expect_error(capsys, ["cache", "verify", "--limit", "-1"], "--limit -1: give a number of prompts")


def test_cache_stats_and_clear_by_model(data_dir: Path, tmp_path: Path, capsys) -> None:
    """Two models share the folder: stats show each one's bytes, clearing one leaves the other's."""
    tiny = write_tiny_llama(tmp_path / "tiny.gguf")
    persona = "You answer in one word, and always politely. " * 8  # a full block or more of tokens
    for model in (str(bundled_model_path()), str(tiny)):
        ask_json(capsys, "Name a colour.", "--system", persona, "--model", model)
    assert main(["cache", "stats", "--json"]) == 0
    models = {row["model"]: row for row in json.loads(capsys.readouterr().out)["models"]}
    assert set(models) == {bundled_model_path().name, "tiny.gguf"}
    assert all(row["bytes"] > 0 and row["entries"] > 0 for row in models.values())
    assert main(["cache", "clear", "--model", str(tiny)]) == 0
    assert f"removed {models['tiny.gguf']['entries']} entries of tiny.gguf" in capsys.readouterr().out
    assert main(["cache", "stats"]) == 0
    report = capsys.readouterr().out
    assert "by model (1):" in report
    assert bundled_model_path().name in report
    answer, _ = ask_json(capsys, "Name a fruit.", "--system", persona)
    assert answer["reused_tokens"] > 0, "the other model's entries stayed"


def test_bench_is_a_command_and_a_missing_llama_server_is_one_line(capsys) -> None:
    code = main(
        ["bench", "--scale", "tiny", "--llama-server", "/nonexistent/llama-server", "--out", "/nonexistent-out"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert any("llama-server" in line and "/nonexistent/llama-server" in line for line in err)
    assert not any("Traceback" in line for line in err)


def test_a_damaged_conversations_database_is_one_line_with_a_backup(data_dir: Path, capsys) -> None:
    data_dir.mkdir(parents=True)
    database = data_dir / "chatapp.sqlite3"
    database.write_bytes(b"this was a database once" * 50)
    expect_error(capsys, ["cache", "clear"], "is damaged")
    backups = list(data_dir.glob("chatapp.sqlite3.corrupt-*"))
    assert len(backups) == 1
    assert backups[0].read_bytes() == database.read_bytes()


def test_a_damaged_cache_database_is_one_line_and_cache_clear_removes_it(data_dir: Path, capsys) -> None:
    blocks = data_dir / "cache" / "kv" / "blocks"
    blocks.mkdir(parents=True)
    (blocks / "cache.db").write_bytes(b"not sqlite at all" * 100)
    expect_error(capsys, ["cache", "stats"], "`chatapp cache clear` empties it")
    assert main(["cache", "clear"]) == 0
    capsys.readouterr()
    assert main(["cache", "stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["disk"]["entries"] == 0


@pytest.mark.parametrize(
    ("argv", "model", "data_dir", "threads"),
    [
        (["--model", "m.gguf", "--data-dir", "d", "--threads", "3", "ask", "q"], "m.gguf", "d", 3),
        (["ask", "--model", "m.gguf", "--data-dir", "d", "q"], "m.gguf", "d", None),
        (["--model", "before.gguf", "ask", "--model", "after.gguf", "q"], "after.gguf", None, None),
        (["--data-dir", "d", "cache", "stats"], None, "d", None),
        (["ask", "q"], None, None, None),
    ],
)
def test_shared_options_mean_the_same_before_and_after_the_command(
    argv: list[str], model: str | None, data_dir: str | None, threads: int | None
) -> None:
    """`chatapp --model M ask ...` once silently ran the bundled model: the command's defaults won."""
    args = cli.build_parser().parse_args(argv)
    assert (args.model, args.data_dir, args.threads) == (model, data_dir, threads)


def test_models_lists_what_is_on_the_machine_and_model_takes_a_listed_name(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    for variable in ("OLLAMA_MODELS", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "LLAMA_CACHE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    studio = home / ".lmstudio" / "models" / "HuggingFaceTB" / "SmolLM2-GGUF"
    studio.mkdir(parents=True)
    (studio / "smollm2-q4_1.gguf").symlink_to(bundled_model_path())
    assert main(["models"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["NAME", "FAMILY", "PARAMS", "QUANT", "CONTEXT", "MEMORY", "SIZE", "PATH"]
    assert any(line.startswith("SmolLM2-135M-Instruct.Q4_1 ") for line in table), "the bundled model"
    assert main(["models", "--json"]) == 0
    records = {record["name"]: record for record in json.loads(capsys.readouterr().out)}
    assert set(records) == {"SmolLM2-135M-Instruct.Q4_1"}, "the LM Studio link is the same file: listed once"
    (studio / "smollm2-q4_1.gguf").unlink()
    (studio / "smollm2-q4_1.gguf").write_bytes(bundled_model_path().read_bytes())
    assert main(["models", "--json"]) == 0
    records = {record["name"]: record for record in json.loads(capsys.readouterr().out)}
    assert records["HuggingFaceTB/SmolLM2-GGUF:smollm2-q4_1"]["quantization"] == "Q4_1"
    answer, _ = ask_json(capsys, "hi", "--model", "HuggingFaceTB/SmolLM2-GGUF:smollm2-q4_1")
    assert answer["model"].endswith("SmolLM2-GGUF/smollm2-q4_1.gguf")
    expect_error(capsys, ["ask", "hi", "--model", "smollm2-q4_2"], "closest: HuggingFaceTB/SmolLM2-GGUF:smollm2-q4_1")


def test_cache_advise_predicts_what_was_measured_at_the_budgets_in_force(data_dir: Path, capsys) -> None:
    assert main(["cache", "advise"]) == 0
    assert "no requests logged yet" in capsys.readouterr().out
    system = ["--system", "You answer in one word, and never more than one word, whatever you are asked."]
    for question in ("Name a colour.", "Name a fruit.", "Name a colour.", "Name a tree."):
        ask_json(capsys, question, *system)
    assert main(["cache", "advise", "--json"]) == 0
    advice = json.loads(capsys.readouterr().out)
    assert advice["requests"] == 4
    assert advice["sample_rate"] == 1.0
    assert 0 < advice["measured_share"] < 1
    # The replay of the log at the budgets in force is the cache's own behaviour, token for token.
    assert advice["predicted_share"] == pytest.approx(advice["measured_share"])
    rows = advice["disk"]
    assert [row["current"] for row in rows].count(True) == 1
    assert rows[-1]["budget_bytes"] is None  # unlimited
    shares = [row["reused_share"] for row in rows]
    assert shares == sorted(shares)
    assert rows[0]["holds_bytes"] > 0
    assert all(row["prefill_saved_s"] is not None for row in rows)
    assert main(["cache", "advise"]) == 0
    report = capsys.readouterr().out
    assert "4 requests" in report
    assert "<- in force" in report
    assert "suggestion:" in report
    log = data_dir / "cache" / "kv" / "requests.log"
    assert main(["cache", "advise", "--log", str(log), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 4
    assert main(["cache", "advise", "--log", str(data_dir / "missing.log")]) == 2
    assert "no request log at" in capsys.readouterr().err
    assert main(["cache", "clear"]) == 0
    assert not log.exists()
