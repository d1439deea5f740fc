"""Writing a tiny random-weight llama GGUF model for tests.

The model has the bundled SmolLM2 model's real tokenizer and ChatML chat template (every
`tokenizer.*` key is copied, vocabulary 49,152), but only a few small layers of random
weights. llama.cpp loads it in milliseconds and answers a short request in a few more, so
property-based tests can run thousands of real decodes, restores and cuts. Its answers are
gibberish, but they are deterministic and depend on the whole prompt, which is what tests
of caching and reuse need.

Load it with one thread (`EngineConfig(threads=1)`, or TINY_MODEL_THREADS): its matrices
are too small to share out, and with two threads llama.cpp's spinning thread barriers turn
a 15 ms request into seconds whenever another process wants the same cores.

Reading the bundled model's metadata with `gguf.GGUFReader` takes seconds (it builds numpy
views for each of its ~100,000 token and merge strings), so the `tokenizer.*` keys are read
here by a small parser of the GGUF key-value section instead, once per process.
"""

from __future__ import annotations

import functools
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from chatapp.model_files import bundled_model_path

TINY_MODEL_THREADS = 1
ARCH = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA]  # "llama"
TOKENIZER_PREFIX = "tokenizer."
RMS_NORM_EPS = 1e-5
ROPE_FREQ_BASE = 10_000.0

# Standard deviations of the random weights, chosen by measurement. RMS norm precedes every
# matrix product, so only ratios and the output scale matter:
# - embeddings at 1.0 keep the current token visible through the residual stream;
# - layer weights at 0.3 make attention matter: changing one early prompt token changes
#   the first answer token in about 1 prompt in 5 and the 16-token answer in all of them
#   (at 0.02..0.1 the first answer token never changed: it was a function of the last
#   prompt token only, too weak for tests of KV reuse);
# - the output projection at 0.35 gives logits with a spread of about 2.8: the top-1 / top-2
#   margin is about 0.6 (median) and above 0.1 over 16 greedy tokens, so greedy decoding
#   has clear winners, and temperature 1 still samples varied tokens.
EMBEDDING_STD = 1.0
LAYER_STD = 0.3
OUTPUT_STD = 0.35

_SCALAR_FORMATS = {
    gguf.GGUFValueType.UINT8: "<B",
    gguf.GGUFValueType.INT8: "<b",
    gguf.GGUFValueType.UINT16: "<H",
    gguf.GGUFValueType.INT16: "<h",
    gguf.GGUFValueType.UINT32: "<I",
    gguf.GGUFValueType.INT32: "<i",
    gguf.GGUFValueType.FLOAT32: "<f",
    gguf.GGUFValueType.UINT64: "<Q",
    gguf.GGUFValueType.INT64: "<q",
    gguf.GGUFValueType.FLOAT64: "<d",
    gguf.GGUFValueType.BOOL: "<?",
}


@dataclass(frozen=True)
class MetadataField:
    """One GGUF key-value pair, as `GGUFWriter.add_key_value` takes it."""

    key: str
    value: Any
    type: gguf.GGUFValueType
    sub_type: gguf.GGUFValueType | None = None


def write_tiny_llama(
    path: Path,
    *,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx_train: int = 4096,
    seed: int = 0,
) -> Path:
    """Write a random-weight llama model with the bundled tokenizer to `path`; returns `path`.

    The same arguments always give a byte-identical file. The weights are F16 (the norms
    F32), so the file is about 4 * 49,152 * n_embd bytes (the embeddings and the output
    projection) plus 1.9 MB, mostly the tokenizer: 14.5 MB with the defaults.
    """
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must be a multiple of n_head, and n_head a multiple of n_head_kv")
    head_dim = n_embd // n_head
    if head_dim % 2:
        raise ValueError("the head dimension (n_embd / n_head) must be even for RoPE")
    tokenizer = tokenizer_fields(bundled_model_path())
    n_vocab = next(len(field.value) for field in tokenizer if field.key == gguf.Keys.Tokenizer.LIST)

    writer = gguf.GGUFWriter(path, ARCH)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(f"tiny-random-llama-{n_layer}x{n_embd}-seed{seed}")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_vocab_size(n_vocab)
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(ROPE_FREQ_BASE)
    writer.add_layer_norm_rms_eps(RMS_NORM_EPS)
    for field in tokenizer:
        writer.add_key_value(field.key, field.value, field.type, field.sub_type)

    # numpy shapes are ggml's reversed: a ggml tensor {n_in, n_out} is a numpy (n_out, n_in).
    rng = np.random.default_rng(seed)

    def matrix(n_out: int, n_in: int, std: float) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in), dtype=np.float32) * np.float32(std)).astype(np.float16)

    def norm() -> np.ndarray:
        return np.ones(n_embd, dtype=np.float32)

    def name(tensor: gguf.MODEL_TENSOR, layer: int | None = None) -> str:
        base = gguf.TENSOR_NAMES[tensor]
        return (base.format(bid=layer) if layer is not None else base) + ".weight"

    T = gguf.MODEL_TENSOR
    n_q, n_kv = n_head * head_dim, n_head_kv * head_dim
    writer.add_tensor(name(T.TOKEN_EMBD), matrix(n_vocab, n_embd, EMBEDDING_STD))
    for layer in range(n_layer):
        writer.add_tensor(name(T.ATTN_NORM, layer), norm())
        writer.add_tensor(name(T.ATTN_Q, layer), matrix(n_q, n_embd, LAYER_STD))
        writer.add_tensor(name(T.ATTN_K, layer), matrix(n_kv, n_embd, LAYER_STD))
        writer.add_tensor(name(T.ATTN_V, layer), matrix(n_kv, n_embd, LAYER_STD))
        writer.add_tensor(name(T.ATTN_OUT, layer), matrix(n_embd, n_q, LAYER_STD))
        writer.add_tensor(name(T.FFN_NORM, layer), norm())
        writer.add_tensor(name(T.FFN_GATE, layer), matrix(n_ff, n_embd, LAYER_STD))
        writer.add_tensor(name(T.FFN_UP, layer), matrix(n_ff, n_embd, LAYER_STD))
        writer.add_tensor(name(T.FFN_DOWN, layer), matrix(n_embd, n_ff, LAYER_STD))
    writer.add_tensor(name(T.OUTPUT_NORM), norm())
    writer.add_tensor(name(T.OUTPUT), matrix(n_vocab, n_embd, OUTPUT_STD))

    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return path


def tokenizer_fields(model: Path) -> tuple[MetadataField, ...]:
    """Every `tokenizer.*` key of the GGUF file `model`, in file order (cached per file version)."""
    stat = model.stat()
    return _tokenizer_fields(model.resolve(), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _tokenizer_fields(model: Path, _size: int, _mtime_ns: int) -> tuple[MetadataField, ...]:
    with model.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        magic, version, _n_tensors, n_kv = struct.unpack_from("<4sIQQ", data, 0)
        if magic != b"GGUF" or version < 2:
            raise ValueError(f"{model} is not a GGUF v2+ file")
        offset = 24
        fields = []
        for _ in range(n_kv):
            key, offset = _read_string(data, offset)
            (raw_type,), offset = struct.unpack_from("<I", data, offset), offset + 4
            value_type = gguf.GGUFValueType(raw_type)
            sub_type = None
            if value_type == gguf.GGUFValueType.ARRAY:
                sub_type = gguf.GGUFValueType(struct.unpack_from("<I", data, offset)[0])
                value, offset = _read_array(data, offset + 4, sub_type)
            else:
                value, offset = _read_value(data, offset, value_type)
            name = key.decode("utf-8")
            if name.startswith(TOKENIZER_PREFIX):
                fields.append(MetadataField(name, value, value_type, sub_type))
    return tuple(fields)


def _read_string(data: mmap.mmap, offset: int) -> tuple[bytes, int]:
    (length,) = struct.unpack_from("<Q", data, offset)
    start = offset + 8
    return data[start : start + length], start + length


def _read_value(data: mmap.mmap, offset: int, value_type: gguf.GGUFValueType) -> tuple[Any, int]:
    if value_type == gguf.GGUFValueType.STRING:
        raw, offset = _read_string(data, offset)
        return raw.decode("utf-8"), offset
    fmt = _SCALAR_FORMATS[value_type]
    return struct.unpack_from(fmt, data, offset)[0], offset + struct.calcsize(fmt)


def _read_array(data: mmap.mmap, offset: int, sub_type: gguf.GGUFValueType) -> tuple[list[Any], int]:
    (count,) = struct.unpack_from("<Q", data, offset)
    offset += 8
    if sub_type == gguf.GGUFValueType.STRING:
        # Kept as bytes: GGUFWriter writes bytes strings as they are, with no decode/encode.
        items = []
        for _ in range(count):
            item, offset = _read_string(data, offset)
            items.append(item)
        return items, offset
    if sub_type == gguf.GGUFValueType.ARRAY:
        raise ValueError("nested GGUF arrays are not supported")
    fmt = _SCALAR_FORMATS[sub_type]
    size = struct.calcsize(fmt)
    items = np.frombuffer(data, dtype=np.dtype(fmt), count=count, offset=offset).tolist()
    return items, offset + size * count
