"""Writing tiny random-weight GGUF models for tests: llama, and gemma3, LFM2 and Mamba.

The model has the bundled SmolLM2 model's real tokenizer and ChatML chat template (every
`tokenizer.*` key is copied, vocabulary 49,152), but only a few small layers of random
weights. llama.cpp loads it in milliseconds and answers a short request in a few more, so
property-based tests can run thousands of real decodes, restores and cuts. Its answers are
gibberish, but they are deterministic and depend on the whole prompt, which is what tests
of caching and reuse need. The other kinds give llama.cpp's other memories the same tests:
gemma3 a KV cache in two parts (interleaved sliding-window attention), LFM2 a KV cache and
recurrent state (hybrid), Mamba recurrent state only.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from chatapp.model_files import bundled_model_path

TINY_MODEL_THREADS = 1
# Mistral's markers, special tokens in its vocabularies (`write_tiny_llama(special_tokens=...)`): BOS and EOS
# as Mistral's, then the markers its chat templates print and its models write.
MISTRAL_SPECIAL_TOKENS = (
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[ARGS]",
    "[CALL_ID]",
    "[TOOL_CONTENT]",
    "[THINK]",
    "[/THINK]",
)
TOKENIZER_PREFIX = "tokenizer."
RMS_NORM_EPS = 1e-5
ROPE_FREQ_BASE = 10_000.0
T = gguf.MODEL_TENSOR
# gpt-oss's harmony markers as single special tokens in place of unused ones (`special_tokens`):
# llama.cpp then treats them as it treats gpt-oss's (`<|call|>` and `<|return|>` end generation).
HARMONY_TOKENS = {
    3: "<|channel|>",
    4: "<|message|>",
    5: "<|start|>",
    6: "<|end|>",
    7: "<|return|>",
    8: "<|call|>",
    9: "<|constrain|>",
}

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
# The other kinds, measured with 24 chat prompts that differ in one name 24 tokens before
# the end (seeds 0..2; a pair "changes" when its 16-token greedy answers differ):
# - gemma3 multiplies the embeddings by sqrt(n_embd): 1 / sqrt(64) gives them llama's scale;
# - gemma3 and LFM2 normalise each query and key head, which at norm weights of 1 makes
#   attention logits about 6 times flatter than llama's: gemma3's first answer token then
#   changed in 17% of pairs, LFM2's in none. At 2.5 (llama's spread again) all pairs change,
#   the first token in 78..100% (gemma3) and 9..87% (LFM2), and all pairs still change
#   with the name 276 tokens back, far beyond gemma3's sliding window;
# - LFM2's convolution projections at 0.15 (kernel 1.0) keep its convolution layers from
#   drowning its attention layers: at 0.3 the first token changed in 26% of pairs;
# - Mamba's output grows with the product of its conv, x and dt scales: at 0.7, 0.3, 0.3
#   or 1.0, 0.2, 0.3 some prompts gave NaN logits (one token repeated). At 0.5, 0.2, 0.05,
#   still finite with all three 1.5 times as large, all pairs change (the first token in
#   30..87%); the state forgets, though: with the name 276 tokens back, 0..48% change.
GEMMA3_EMBEDDING_STD = 0.125
QK_NORM_WEIGHT = 2.5
LFM2_CONV_STD = 1.0
LFM2_PROJ_STD = 0.15
MAMBA_CONV_STD = 0.5
MAMBA_X_STD = 0.2
MAMBA_DT_STD = 0.05

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
    chat_template: str | None = None,
    split_max_tensors: int = 0,
    special_tokens: Sequence[str] | Mapping[int, str] = (),
) -> Path:
    """Write a random-weight llama model with the bundled tokenizer to `path`; returns `path`.

    `chat_template` replaces the bundled model's (another family's template on the same vocabulary).
    `split_max_tensors` writes a split model (`<stem>-00001-of-0000N.gguf`, ...) and returns its first part.
    `special_tokens` rename the vocabulary's special tokens, so another family's markers are single
    special (control) tokens, as in its own vocabulary (Mistral's `[TOOL_CALLS]`, gpt-oss's
    `<|channel|>`): a list renames them from id 1 on (BOS, EOS, then SmolLM2's spare `<repo_name>`
    ... `<empty_output>`, 16 in all), a mapping renames the ids it names.

    The same arguments always give a byte-identical file. The weights are F16 (the norms
    F32), so the file is about 4 * 49,152 * n_embd bytes (the embeddings and the output
    projection) plus 1.9 MB, mostly the tokenizer: 14.5 MB with the defaults.
    """
    head_dim = _head_dim(n_embd, n_head, [n_head_kv])
    model = _TinyModel.start(
        path,
        gguf.MODEL_ARCH.LLAMA,
        n_layer,
        n_embd,
        n_ff,
        n_head,
        n_head_kv,
        n_ctx_train=n_ctx_train,
        seed=seed,
        split_max_tensors=split_max_tensors,
    )
    if chat_template is not None:
        fields = model.tokenizer
        template_key = gguf.Keys.Tokenizer.CHAT_TEMPLATE
        model = replace(
            model,
            tokenizer=tuple(
                MetadataField(field.key, chat_template, field.type) if field.key == template_key else field
                for field in fields
            ),
        )
    if special_tokens:
        model = replace(model, tokenizer=_renamed_special_tokens(model.tokenizer, special_tokens))
    model.writer.add_rope_dimension_count(head_dim)
    model.writer.add_rope_freq_base(ROPE_FREQ_BASE)
    model.writer.add_layer_norm_rms_eps(RMS_NORM_EPS)
    for layer in range(n_layer):
        model.norm(T.ATTN_NORM, layer)
        model.attention(layer, n_head * head_dim, n_head_kv * head_dim)
        model.norm(T.FFN_NORM, layer)
        model.feed_forward(layer, n_ff)
    return model.finish(T.OUTPUT_NORM)


def write_tiny_gemma3(
    path: Path,
    *,
    n_layer: int = 4,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    sliding_window: int = 16,
    sliding_window_pattern: int = 2,
    n_ctx_train: int = 4096,
    seed: int = 0,
) -> Path:
    """Write a random-weight gemma3 model, with interleaved sliding-window attention, to `path`.

    Of every `sliding_window_pattern` layers the last has full attention and the others see
    only the last `sliding_window` positions, so llama.cpp gives the model a KV cache in two
    parts (iSWA). gemma3's own default pattern, 6, would make every layer of a 4-layer model
    a sliding-window one. The full-attention layers carry tokens older than the window to
    the answer. Same tokenizer, ChatML template, determinism and size as `write_tiny_llama`.
    """
    head_dim = _head_dim(n_embd, n_head, [n_head_kv])
    model = _TinyModel.start(
        path,
        gguf.MODEL_ARCH.GEMMA3,
        n_layer,
        n_embd,
        n_ff,
        n_head,
        n_head_kv,
        n_ctx_train=n_ctx_train,
        seed=seed,
        embedding_std=GEMMA3_EMBEDDING_STD,
    )
    writer = model.writer
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(RMS_NORM_EPS)
    writer.add_rope_freq_base(ROPE_FREQ_BASE)
    writer.add_rope_freq_base_swa(ROPE_FREQ_BASE)
    writer.add_sliding_window(sliding_window)
    writer.add_sliding_window_pattern(sliding_window_pattern)
    for layer in range(n_layer):
        model.norm(T.ATTN_NORM, layer)
        model.attention(layer, n_head * head_dim, n_head_kv * head_dim, qk_norm_size=head_dim)
        model.norm(T.ATTN_POST_NORM, layer)
        model.norm(T.FFN_PRE_NORM, layer)
        model.feed_forward(layer, n_ff)
        model.norm(T.FFN_POST_NORM, layer)
    return model.finish(T.OUTPUT_NORM)


def write_tiny_lfm2(
    path: Path,
    *,
    n_head_kv: Sequence[int] = (0, 2, 0, 2),
    n_embd: int = 64,
    n_head: int = 4,
    n_ff: int = 128,
    l_cache: int = 3,
    n_ctx_train: int = 4096,
    seed: int = 0,
) -> Path:
    """Write a random-weight LFM2 model, a hybrid of short convolutions and attention, to `path`.

    `n_head_kv` has one KV head count per layer (so it sets the layer count too); 0 makes a
    short-convolution layer, whose state llama.cpp keeps in recurrent memory, so the model
    has both a KV cache and recurrent state. `l_cache` is the convolution's length in tokens.
    Same tokenizer, ChatML template, determinism and size as `write_tiny_llama`.
    """
    n_layer = len(n_head_kv)
    head_dim = _head_dim(n_embd, n_head, [count for count in n_head_kv if count])
    model = _TinyModel.start(
        path, gguf.MODEL_ARCH.LFM2, n_layer, n_embd, n_ff, n_head, list(n_head_kv), n_ctx_train=n_ctx_train, seed=seed
    )
    model.writer.add_rope_freq_base(ROPE_FREQ_BASE)
    model.writer.add_layer_norm_rms_eps(RMS_NORM_EPS)
    model.writer.add_shortconv_l_cache(l_cache)
    for layer, kv_heads in enumerate(n_head_kv):
        model.norm(T.ATTN_NORM, layer)
        if kv_heads:
            model.attention(layer, n_head * head_dim, kv_heads * head_dim, qk_norm_size=head_dim)
        else:
            model.convolution(T.SHORTCONV_CONV, layer, (n_embd, l_cache), LFM2_CONV_STD)
            model.matrix(T.SHORTCONV_INPROJ, 3 * n_embd, n_embd, LFM2_PROJ_STD, layer)
            model.matrix(T.SHORTCONV_OUTPROJ, n_embd, n_embd, LFM2_PROJ_STD, layer)
        model.norm(T.FFN_NORM, layer)
        model.feed_forward(layer, n_ff)
    return model.finish(T.TOKEN_EMBD_NORM)  # LFM2's final norm has this name


def write_tiny_mamba(
    path: Path,
    *,
    n_layer: int = 2,
    n_embd: int = 64,
    d_state: int = 16,
    d_conv: int = 4,
    dt_rank: int = 4,
    n_ctx_train: int = 4096,
    seed: int = 0,
) -> Path:
    """Write a random-weight Mamba (1) model, purely recurrent, to `path`.

    The inner size is 2 * n_embd, which llama.cpp requires. A and the time steps follow
    Mamba's initialisation rather than noise (A = -1..-d_state, steps 0.001..0.1), so that
    the state decays slowly and remembers earlier tokens. Same tokenizer, ChatML template,
    determinism and size as `write_tiny_llama`.
    """
    d_inner = 2 * n_embd
    model = _TinyModel.start(path, gguf.MODEL_ARCH.MAMBA, n_layer, n_embd, 0, 0, 0, n_ctx_train=n_ctx_train, seed=seed)
    writer = model.writer
    writer.add_ssm_conv_kernel(d_conv)
    writer.add_ssm_inner_size(d_inner)
    writer.add_ssm_state_size(d_state)
    writer.add_ssm_time_step_rank(dt_rank)
    writer.add_layer_norm_rms_eps(RMS_NORM_EPS)
    a = -np.tile(np.arange(1, d_state + 1, dtype=np.float32), (d_inner, 1))  # stored as A, not log(-A)
    for layer in range(n_layer):
        model.norm(T.ATTN_NORM, layer)
        model.matrix(T.SSM_IN, 2 * d_inner, n_embd, LAYER_STD, layer)
        model.convolution(T.SSM_CONV1D, layer, (d_inner, d_conv), MAMBA_CONV_STD)
        model.add(T.SSM_CONV1D, np.zeros(d_inner, dtype=np.float32), layer, "bias")
        model.matrix(T.SSM_X, dt_rank + 2 * d_state, d_inner, MAMBA_X_STD, layer)
        model.matrix(T.SSM_DT, d_inner, dt_rank, MAMBA_DT_STD, layer)
        time_steps = np.exp(model.rng.uniform(np.log(0.001), np.log(0.1), d_inner))
        model.add(T.SSM_DT, (time_steps + np.log(-np.expm1(-time_steps))).astype(np.float32), layer, "bias")
        model.add(T.SSM_A, a, layer, None)  # no ".weight" in llama.cpp's names for A and D
        model.add(T.SSM_D, np.ones(d_inner, dtype=np.float32), layer, None)
        model.matrix(T.SSM_OUT, n_embd, d_inner, LAYER_STD, layer)
    return model.finish(T.OUTPUT_NORM)


@dataclass(frozen=True)
class _TinyModel:
    """A tiny model's GGUF file while it is written: what every architecture shares.

    The weights are drawn from one generator seeded by the caller, in the order they are
    added, so the same arguments always give the same bytes. numpy shapes are ggml's
    reversed: a ggml tensor {n_in, n_out} is a numpy (n_out, n_in).
    """

    path: Path
    writer: gguf.GGUFWriter
    rng: np.random.Generator
    tokenizer: tuple[MetadataField, ...]
    n_vocab: int
    n_embd: int

    @classmethod
    def start(
        cls,
        path: Path,
        arch: gguf.MODEL_ARCH,
        n_layer: int,
        n_embd: int,
        n_ff: int,
        n_head: int,
        n_head_kv: int | Sequence[int],
        *,
        n_ctx_train: int,
        seed: int,
        embedding_std: float = EMBEDDING_STD,
        split_max_tensors: int = 0,
    ) -> _TinyModel:
        """Add the metadata keys every architecture has, and the token embeddings."""
        tokenizer = tokenizer_fields(bundled_model_path())
        n_vocab = next(len(field.value) for field in tokenizer if field.key == gguf.Keys.Tokenizer.LIST)
        arch_name = gguf.MODEL_ARCH_NAMES[arch]
        writer = gguf.GGUFWriter(path, arch_name, split_max_tensors=split_max_tensors)
        writer.add_type(gguf.GGUFType.MODEL)
        writer.add_name(f"tiny-random-{arch_name}-{n_layer}x{n_embd}-seed{seed}")
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        writer.add_vocab_size(n_vocab)
        writer.add_context_length(n_ctx_train)
        writer.add_embedding_length(n_embd)
        writer.add_block_count(n_layer)
        writer.add_feed_forward_length(n_ff)
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_head_kv)
        model = cls(path, writer, np.random.default_rng(seed), tokenizer, n_vocab, n_embd)
        model.matrix(T.TOKEN_EMBD, n_vocab, n_embd, embedding_std)
        return model

    def finish(self, final_norm: gguf.MODEL_TENSOR) -> Path:
        """Add the final norm, the output projection and the tokenizer keys; write the file."""
        self.norm(final_norm)
        # The control tokens' rows are zero: their logit is exactly 0 where the words' reach about +10, so greedy
        # answers never end by themselves (every end token is a control token) on any CPU, unless a grammar
        # leaves nothing else. Same draws as `matrix`, so the other rows are what they always were.
        output = self.rng.standard_normal((self.n_vocab, self.n_embd), dtype=np.float32) * np.float32(OUTPUT_STD)
        token_types = next(field.value for field in self.tokenizer if field.key == gguf.Keys.Tokenizer.TOKEN_TYPE)
        output[np.asarray(token_types) == gguf.TokenType.CONTROL] = 0.0
        self.add(T.OUTPUT, output.astype(np.float16), None)
        writer = self.writer
        for field in self.tokenizer:
            writer.add_key_value(field.key, field.value, field.type, field.sub_type)
        try:
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
        if self.writer.split_max_tensors:
            return self.path.with_name(f"{self.path.stem}-00001-of-{len(self.writer.tensors):05d}.gguf")
        return self.path

    def add(
        self, tensor: gguf.MODEL_TENSOR, data: np.ndarray, layer: int | None, suffix: str | None = "weight"
    ) -> None:
        base = gguf.TENSOR_NAMES[tensor]
        name = base.format(bid=layer) if layer is not None else base
        self.writer.add_tensor(f"{name}.{suffix}" if suffix else name, data)

    def matrix(self, tensor: gguf.MODEL_TENSOR, n_out: int, n_in: int, std: float, layer: int | None = None) -> None:
        """An F16 matrix of normal noise."""
        noise = self.rng.standard_normal((n_out, n_in), dtype=np.float32) * np.float32(std)
        self.add(tensor, noise.astype(np.float16), layer)

    def convolution(self, tensor: gguf.MODEL_TENSOR, layer: int, shape: tuple[int, int], std: float) -> None:
        """A convolution kernel of normal noise, F32: ggml's ssm_conv asserts it (F16 aborts the process)."""
        self.add(tensor, self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std), layer)

    def norm(self, tensor: gguf.MODEL_TENSOR, layer: int | None = None, size: int = 0, value: float = 1.0) -> None:
        """An RMS norm's F32 weight, all `value`, of n_embd elements unless `size` says otherwise."""
        self.add(tensor, np.full(size or self.n_embd, value, dtype=np.float32), layer)

    def attention(self, layer: int, n_q: int, n_kv: int, *, qk_norm_size: int = 0) -> None:
        """The query, key, value and output projections; with `qk_norm_size`, per-head Q/K norms."""
        self.matrix(T.ATTN_Q, n_q, self.n_embd, LAYER_STD, layer)
        self.matrix(T.ATTN_K, n_kv, self.n_embd, LAYER_STD, layer)
        self.matrix(T.ATTN_V, n_kv, self.n_embd, LAYER_STD, layer)
        self.matrix(T.ATTN_OUT, self.n_embd, n_q, LAYER_STD, layer)
        if qk_norm_size:
            self.norm(T.ATTN_Q_NORM, layer, qk_norm_size, QK_NORM_WEIGHT)
            self.norm(T.ATTN_K_NORM, layer, qk_norm_size, QK_NORM_WEIGHT)

    def feed_forward(self, layer: int, n_ff: int) -> None:
        """A gated feed-forward block: gate, up and down projections."""
        self.matrix(T.FFN_GATE, n_ff, self.n_embd, LAYER_STD, layer)
        self.matrix(T.FFN_UP, n_ff, self.n_embd, LAYER_STD, layer)
        self.matrix(T.FFN_DOWN, self.n_embd, n_ff, LAYER_STD, layer)


def _renamed_special_tokens(
    fields: tuple[MetadataField, ...], texts: Sequence[str] | Mapping[int, str]
) -> tuple[MetadataField, ...]:
    """The tokenizer keys with some special tokens renamed (still control tokens): a list from id 1 on."""
    renames = dict(texts) if isinstance(texts, Mapping) else {1 + index: text for index, text in enumerate(texts)}
    token_types = next(field.value for field in fields if field.key == gguf.Keys.Tokenizer.TOKEN_TYPE)
    if any(token_types[token] != gguf.TokenType.CONTROL for token in renames):
        raise ValueError("only control tokens can be renamed: the bundled vocabulary has 16 after id 0")
    renamed_fields = []
    for field in fields:
        if field.key == gguf.Keys.Tokenizer.LIST:
            tokens = list(field.value)
            for token, text in renames.items():
                tokens[token] = text.encode("utf-8")
            field = replace(field, value=tokens)
        renamed_fields.append(field)
    return tuple(renamed_fields)


def _head_dim(n_embd: int, n_head: int, kv_heads: Sequence[int]) -> int:
    """The attention head dimension, once the head counts are checked to fit together."""
    if n_embd % n_head or any(count <= 0 or n_head % count for count in kv_heads):
        raise ValueError("n_embd must be a multiple of n_head, and n_head a multiple of n_head_kv")
    head_dim = n_embd // n_head
    if head_dim % 2:
        raise ValueError("the head dimension (n_embd / n_head) must be even for RoPE")
    return head_dim


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


def copy_with_chat_template(source: Path, target: Path, template: str) -> Path:
    """A copy of the GGUF `source` whose chat template is `template`, all else byte for byte; returns `target`.

    A real model speaking another family's template (the bundled SmolLM2, trained on ChatML,
    with a Qwen3-style template and its tool format): only the template's key-value entry is
    rewritten, and the tensor data moves to the next aligned offset after the header.
    """
    template_key = gguf.Keys.Tokenizer.CHAT_TEMPLATE.encode()
    with source.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", data, 0)
        if magic != b"GGUF" or version < 2:
            raise ValueError(f"{source} is not a GGUF v2+ file")
        offset, alignment, span = 24, gguf.GGUF_DEFAULT_ALIGNMENT, None
        for _ in range(n_kv):
            start = offset
            key, offset = _read_string(data, offset)
            value_type = gguf.GGUFValueType(struct.unpack_from("<I", data, offset)[0])
            offset += 4
            if value_type == gguf.GGUFValueType.ARRAY:
                sub_type = gguf.GGUFValueType(struct.unpack_from("<I", data, offset)[0])
                _, offset = _read_array(data, offset + 4, sub_type)
            else:
                value, offset = _read_value(data, offset, value_type)
                if key == gguf.Keys.General.ALIGNMENT.encode():
                    alignment = int(value)
            if key == template_key:
                span = (start, offset)
        for _ in range(n_tensors):  # name, dimensions, type and offset of each tensor
            _, offset = _read_string(data, offset)
            (n_dims,) = struct.unpack_from("<I", data, offset)
            offset += 4 + 8 * n_dims + 4 + 8
        if span is None:
            raise ValueError(f"{source} has no chat template to replace")
        encoded = template.encode("utf-8")
        entry = struct.pack("<Q", len(template_key)) + template_key
        entry += struct.pack("<IQ", gguf.GGUFValueType.STRING, len(encoded)) + encoded
        header = data[: span[0]] + entry + data[span[1] : offset]
        data_start = offset + (-offset) % alignment
        with target.open("wb") as out:
            out.write(header + b"\0" * ((-len(header)) % alignment))
            out.write(data[data_start:])
    return target


def quantize_model(source: Path, target: Path, kind: str, *, threads: int = 2) -> Path:
    """Quantize the GGUF at `source` to `kind` (a llama_ftype name: "Q4_0", "Q4_K_M", ...) at `target`.

    llama.cpp's own quantizer (llama_model_quantize), as `llama-quantize` does it: the same
    mix of tensor types per kind (the output projection in Q6_K for most), so a test sees
    the kernels a downloaded file of that kind would take. K-quants need rows a multiple of
    256 wide: narrower tensors fall back to other types (write_tiny_llama's n_embd=256).
    """
    import llama_cpp

    from chatapp.engine.llama_native import initialise_llama

    initialise_llama()  # the quantizer logs every tensor: to Python logging, not the terminal
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}")
    if llama_cpp.llama_model_quantize(str(source).encode("utf-8"), str(target).encode("utf-8"), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {source.name} to {kind}")
    return target


def write_projector(path: Path) -> Path:
    """A vision projector's GGUF (general.type mmproj, architecture clip): a file that is no language model."""
    writer = gguf.GGUFWriter(path, "clip")
    writer.add_type("mmproj")
    writer.add_tensor("v.patch_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
