"""Write the wide-KV model bench W measures: random weights, KV shaped like an 8B model's.

32 layers of 8 x 128 KV heads: 128 KiB of f16 KV a token, as Llama 3.1 8B, so an 8k-token prefix is
a 1 GiB state; but narrow feed-forward layers and a small vocabulary's embeddings keep the file at
1.0 GB and a token's compute within a laptop's reach. Its answers are nonsense; what it is for is
the size of its states. The same file every time (written from a fixed seed, with the bundled
tokenizer), so runs on two machines measure the same thing:

    python tools/wide_model.py /tmp/wide.gguf
    chatapp bench --workloads W --peers chatapp --model /tmp/wide.gguf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.model_factory import write_tiny_llama


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="where to write the .gguf file")
    args = parser.parse_args()
    written = write_tiny_llama(args.path, n_layer=32, n_embd=1024, n_head=8, n_head_kv=8, n_ff=2816, n_ctx_train=8192)
    print(f"{written}: {written.stat().st_size / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
