"""/metrics in the Prometheus text format, counting what the requests did; /health open to all."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server_support import SYSTEM_PROMPT, RunningServer, running_server


def samples(http: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(figures: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return figures.get((name, tuple(sorted(labels.items()))), 0.0)


def test_counters_match_the_requests_made(http: httpx.Client, client: openai.OpenAI, server: RunningServer) -> None:
    before = samples(http)
    messages = [{"role": "system", "content": SYSTEM_PROMPT + " (metrics)"}, {"role": "user", "content": "Hi"}]
    usages = []
    for _ in range(2):
        completion = client.chat.completions.create(model=server.model_id, messages=messages, temperature=0)
        usages.append(completion.usage)
    http.post("/v1/chat/completions", json={"model": "nope", "messages": messages})
    after = samples(http)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("chatapp_requests_total", route="/v1/chat/completions", status="200") == 2
    assert grew("chatapp_requests_total", route="/v1/chat/completions", status="404") == 1
    assert grew("chatapp_prompt_tokens_total") == sum(usage.prompt_tokens for usage in usages)
    assert grew("chatapp_generated_tokens_total") == sum(usage.completion_tokens for usage in usages)
    cached = sum(usage.prompt_tokens_details.cached_tokens for usage in usages)
    reused = sum(grew("chatapp_reused_prompt_tokens_total", tier=tier) for tier in ("device", "ram", "disk"))
    assert reused == cached > 0
    assert grew("chatapp_computed_prompt_tokens_total") == sum(usage.prompt_tokens for usage in usages) - cached
    assert grew("chatapp_time_to_first_token_seconds_count") == 2
    assert grew("chatapp_request_duration_seconds_count") == 2
    assert ("chatapp_cache_evictions_total", (("tier", "disk"),)) in after
    # The restore checks (the second answer reused the first's KV: sampled, checked when the server is idle).
    assert ("chatapp_cache_checks_total", (("outcome", "equal"),)) in after
    assert value(after, "chatapp_cache_checks_total", outcome="mismatched") == 0
    assert ("chatapp_cache_reuse_stopped", ()) in after
    assert value(after, "chatapp_cache_reuse_stopped") == 0
    # Sizing advice from the request log (this server's first scrape computed it; the next ones reuse it).
    predicted = {
        labels: share for (name, labels), share in after.items() if name == "chatapp_cache_predicted_reuse_ratio"
    }
    assert (("disk_budget_bytes", "+Inf"),) in predicted
    shares = [predicted[key] for key in sorted(predicted, key=lambda key: float(key[0][1]))]
    assert shares == sorted(shares)
    assert 0 <= value(after, "chatapp_cache_predicted_reuse_ratio_in_force") <= 1
    assert ("chatapp_cache_logged_reuse_ratio", ()) in after


def test_with_a_key_every_route_but_health_needs_it(tmp_path: Path, model_path: Path) -> None:
    with running_server(tmp_path / "data", model_path, api_key="s3cret") as server:
        with httpx.Client(base_url=server.url) as http:
            assert http.get("/health").json()["status"] == "ok"
            for path in ("/v1/models", "/metrics", "/api/tags"):
                refused = http.get(path)
                assert refused.status_code == 401, path
                assert "API key" in str(refused.json()["error"])
            assert http.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert http.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        keyed = openai.OpenAI(base_url=f"{server.url}/v1", api_key="s3cret", max_retries=0)
        assert keyed.models.list().data[0].id == server.model_id
        with (
            openai.OpenAI(base_url=f"{server.url}/v1", api_key="guess", max_retries=0) as guessing,
            pytest.raises(openai.AuthenticationError),
        ):
            guessing.models.list()
