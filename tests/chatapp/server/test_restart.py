"""The cache outlives the server and is shared: after a restart, or stored by another process, it is read from disk."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.server_support import SYSTEM_PROMPT, running_server


def test_cached_tokens_after_a_restart_come_from_disk(tmp_path: Path, model_path: Path) -> None:
    data = tmp_path / "data"
    system = {"role": "system", "content": SYSTEM_PROMPT}
    answers = []
    for question in ("Which lighthouse is the oldest?", "How tall are lighthouses?"):
        with running_server(data, model_path) as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300)
            raw = client.chat.completions.with_raw_response.create(
                model=server.model_id, messages=[system, {"role": "user", "content": question}], temperature=0
            )
            answers.append((raw.parse(), raw.headers["x-chatapp-cache"]))
            client.close()
    (cold, cold_header), (warm, warm_header) = answers
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert "tier=none" in cold_header
    reused = warm.usage.prompt_tokens_details.cached_tokens
    assert "tier=disk" in warm_header
    assert f"reused={reused};" in warm_header
    assert 64 <= reused < warm.usage.prompt_tokens


def test_a_prompt_reused_from_disk_is_not_said_to_leave_another_prompt(tmp_path: Path, model_path: Path) -> None:
    """After a restart the server has seen only the prompts since; the tokens it reuses from disk came
    from a prompt it has not seen, so a prompt it has seen that shares the template's first tokens
    says nothing of where this one diverged (it said `diverged_at=3` beside `reused=2308`)."""
    data = tmp_path / "data"
    system = {"role": "system", "content": SYSTEM_PROMPT}
    asked(data, model_path, [system, {"role": "user", "content": "Which lighthouse is the oldest?"}])
    other = [{"role": "system", "content": "You are a poet."}, {"role": "user", "content": "A line, please."}]
    _, headers = asked(data, model_path, other, [system, {"role": "user", "content": "How tall are they?"}])
    figures = dict(part.strip().split("=", 1) for part in headers["x-chatapp-cache"].split(";"))
    reused = int(figures["reused"])
    assert figures["tier"] == "disk"
    assert reused >= 64
    # Where this prompt left the one its reused tokens came from is not before those tokens' end.
    assert int(figures.get("diverged_at", reused)) >= reused, headers["x-chatapp-cache"]


def asked(data: Path, model_path: Path, *conversations: list[dict[str, str]]) -> list[Any]:
    """Start a server on `data`, ask it each conversation in turn, stop it: each answer's response headers."""
    with (
        running_server(data, model_path) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300) as client,
    ):
        responses = [
            client.chat.completions.with_raw_response.create(model=server.model_id, messages=messages, temperature=0)
            for messages in conversations
        ]
    return [response.headers for response in responses]


@pytest.mark.slow
def test_a_server_finds_what_another_process_stored_while_it_ran(tmp_path: Path, model_path: Path) -> None:
    data = tmp_path / "data"
    with running_server(data, model_path) as server:  # its index is read at start-up: empty
        # `chatapp ask` in a process of its own, on the same folder, while the server runs.
        chatapp = Path(sys.executable).parent / "chatapp"
        asked = subprocess.run(
            [
                str(chatapp),
                "--data-dir",
                str(data),
                "--model",
                str(model_path),
                "--context",
                "1024",
                "ask",
                "Which lighthouse is the oldest?",
                "--system",
                SYSTEM_PROMPT,
                "--temperature",
                "0",
                "--max-tokens",
                "4",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert asked.returncode == 0, asked.stderr
        assert json.loads(asked.stdout.strip().splitlines()[-1])["reuse_tier"] == "none"
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300)
        raw = client.chat.completions.with_raw_response.create(
            model=server.model_id,
            messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "And the tallest?"}],
            temperature=0,
        )
        client.close()
    reused = raw.parse().usage.prompt_tokens_details.cached_tokens
    assert "tier=disk" in raw.headers["x-chatapp-cache"]
    assert reused >= 64  # the system prompt's blocks, stored by the other process after the server started
