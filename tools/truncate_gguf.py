"""Write a copy of a llama-architecture GGUF that keeps only its first N layers.

The result has the real tokenizer, chat template and architecture but is small enough
to travel where the 98 MB bundled model cannot (the GPU check machine takes 64 MiB).
Its answers are nonsense; what it is for is checking the engine's GPU path.

Needs the `gguf` package (not a project dependency):
    python -m pip install gguf && python tools/truncate_gguf.py IN.gguf OUT.gguf --layers 4
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import gguf


def truncate(source: Path, target: Path, layers: int) -> None:
    reader = gguf.GGUFReader(source)
    architecture = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(target, architecture, endianess=reader.endianess)
    block_count_key = f"{architecture}.block_count"
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        value = layers if field.name == block_count_key else field.contents()
        writer.add_key_value(field.name, value, value_type, sub_type=sub_type)
    kept = [tensor for tensor in reader.tensors if _layer_of(tensor.name) < layers]
    for tensor in kept:
        writer.add_tensor_info(
            tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in kept:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()


def _layer_of(name: str) -> int:
    match = re.match(r"blk\.(\d+)\.", name)
    return int(match.group(1)) if match else -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    truncate(args.source, args.target, args.layers)


if __name__ == "__main__":
    main()
