"""One engine process for the peak-memory test: a question, then the process's peak RSS, as JSON.

Run as `python -m tests.chatapp.engine.memory_probe MODEL FOLDER TOKENS USE_CACHE READY_BYTES [RAM_BYTES]`: each step
of the test is its own process, so each peak is that step's (the short question's, the storing run's,
the restoring run's), as a user's `chatapp ask` runs would be.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

from chatapp.engine.requests import GenerationRequest, SamplingParams
from tests.cache_support import cached_engine

CONTEXT = 4096


def main(model: str, folder: str, tokens: str, use_cache: str, ready_bytes: str, ram_bytes: str = str(1 << 30)) -> None:
    with cached_engine(
        Path(folder),
        Path(model),
        block_size=64,
        context=CONTEXT,
        sequences=1,
        threads=2,
        ready_state_bytes=int(ready_bytes),
        ram_bytes=int(ram_bytes),
    ) as engine:
        prompt = tuple(json.loads(Path(tokens).read_text()))
        request = GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=2), use_cache=use_cache == "1")
        result = engine.generate(request).wait()
        engine.flush_cache()
        state_bytes = engine.placer.layout.bytes_per_cell if engine.placer.layout is not None else 0
    print(
        json.dumps(
            {
                "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "bytes_per_token": state_bytes,
                "reused": result.stats.reused_tokens,
                "tier": result.stats.reuse_tier.value,
                "tokens": list(result.token_ids),
                "logits_digest": result.stats.logits_digest,
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
