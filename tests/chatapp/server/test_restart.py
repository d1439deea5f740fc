"""The cache outlives the server: after a restart the same system prompt is read from disk."""

from __future__ import annotations

from pathlib import Path

import openai

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
