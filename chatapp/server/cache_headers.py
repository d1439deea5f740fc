"""The response headers that say what the cache did for a request, and where its prompt left the closest
earlier one."""

from __future__ import annotations

import json

from chatapp.services.divergence import Divergence

CACHE_HEADER = "X-Chatapp-Cache"
DIVERGENCE_HEADER = "X-Chatapp-Cache-Divergence"


def cache_headers(reused: int, prompt_tokens: int, tier: str, divergence: Divergence | None) -> dict[str, str]:
    """What the cache did; where the prompt left the closest earlier prompt, with its own text there.

    The earlier prompt's text is in the server log only: it may be another client's.
    """
    value = f"reused={reused}; computed={prompt_tokens - reused}; tier={tier}"
    if divergence is None:
        return {CACHE_HEADER: value}
    excerpt = {"before": divergence.before, "after": divergence.after, "place": divergence.place}
    return {
        CACHE_HEADER: f"{value}; diverged_at={divergence.position}",
        DIVERGENCE_HEADER: json.dumps(excerpt, ensure_ascii=True),
    }
