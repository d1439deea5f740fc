"""A thin, typed layer over llama-cpp-python's low-level (ctypes) API.

We use the low-level API rather than `llama_cpp.Llama` because the context must hold
several sequences in separate streams (`n_seq_max` > 1, `kv_unified` off), which `Llama`
does not expose. Only the engine thread touches a `NativeContext`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import xxhash

from cache.memory_kinds import MemoryKind, memory_of
from chatapp.engine.kv_types import KvType
from chatapp.engine.model_card import ModelFacts
from chatapp.engine.thread_switches import brisk_thread_switches
from chatapp.errors import GrammarError, LoadCancelled, ModelError
from chatapp.models.file_types import quantization_name
from chatapp.prompting.grammar import Grammar

llama_logger = logging.getLogger("chatapp.llama")
# ggml_log_level in the llama.cpp this package pins: NONE, DEBUG, INFO, WARN, ERROR, CONT (5).
COMPILED_GRAMMARS_KEPT = 64  # grammars remembered as compiling (a client's tool sets and schemas)
_LOG_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_recent_problems: deque[str] = deque(maxlen=8)
_last_level = logging.DEBUG
_init_lock = threading.Lock()
_initialised = False
# Set while a decode stops because we asked it to: llama.cpp then logs errors ("failed to
# compute graph") that are no failure of ours, and they go to the debug log only.
_abort_requested = threading.Event()


def _route_llama_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    """Send llama.cpp's log to Python logging: never to the terminal, where it would tear the TUI."""
    global _last_level
    python_level = _last_level if level == 5 else _LOG_LEVELS.get(level, logging.DEBUG)
    _last_level = python_level
    if _abort_requested.is_set():
        python_level = logging.DEBUG
    message = text.decode("utf-8", errors="replace").rstrip()
    if python_level >= logging.WARNING and message:
        _recent_problems.append(message)
    if message:
        llama_logger.log(python_level, message)


# Kept at module level: llama.cpp holds the pointer for the life of the process.
_LOG_CALLBACK = llama_cpp.llama_log_callback(_route_llama_log)


def initialise_llama() -> None:
    """Route llama.cpp's log and initialise its backends, once per process."""
    global _initialised
    with _init_lock:
        if _initialised:
            return
        llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _initialised = True


def last_llama_problem() -> str:
    """The most recent warning or error llama.cpp logged, for error messages."""
    return _recent_problems[-1] if _recent_problems else "no reason given"


@functools.cache
def build_name() -> str:
    """The llama.cpp build and the CPU features it runs with: logits compare bit for bit within one only."""
    system = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    return f"llama-cpp-python {llama_cpp.__version__}; {system}"


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build can offload layers to a GPU."""
    initialise_llama()
    return bool(llama_cpp.llama_supports_gpu_offload())


# ggml's device types (ggml-backend.h: CPU, GPU, IGPU, ACCEL): offloaded layers go to a GPU or an
# integrated one (Vulkan names some GPUs so); an accelerator (BLAS, AMX) holds no layers.
_GPU_DEVICES = (1, 2)


@functools.cache
def offload_device() -> str | None:
    """The device offloaded layers run on, as ggml names it ("Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits)"),
    or None for a build (or a machine) with none. llama-cpp-python does not bind ggml's device registry:
    it is read from the ggml library llama.cpp loaded."""
    if not gpu_offload_supported():
        return None
    folder = Path(llama_cpp.__file__).parent / "lib"
    library = next(
        (path for name in ("libggml.so", "libggml.dylib", "ggml.dll") if (path := folder / name).exists()), None
    )
    if library is None:
        return None
    try:
        ggml = ctypes.CDLL(str(library))
        ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
        ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
        for name in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
            getattr(ggml, name).argtypes = [ctypes.c_void_p]
            getattr(ggml, name).restype = ctypes.c_char_p
        ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        ggml.ggml_backend_dev_type.restype = ctypes.c_int
        for index in range(ggml.ggml_backend_dev_count()):
            device = ggml.ggml_backend_dev_get(index)
            if ggml.ggml_backend_dev_type(device) in _GPU_DEVICES:
                name = ggml.ggml_backend_dev_name(device).decode(errors="replace")
                return f"{name}: {ggml.ggml_backend_dev_description(device).decode(errors='replace')}"
    except (OSError, AttributeError) as error:  # another ggml than this code knows: say nothing
        llama_logger.info("cannot read ggml's devices: %s", error)
    return None


class NativeModel:
    """A loaded GGUF model: weights, vocabulary and metadata."""

    def __init__(
        self,
        path: Path,
        *,
        n_gpu_layers: int = 0,
        vocab_only: bool = False,
        progress: Callable[[float], bool] | None = None,
        repack: bool = True,
    ) -> None:
        """`progress` hears the share of the weights loaded (0..1); returning False stops the load
        (LoadCancelled). `repack` off keeps the weights in the file's layout (llama.cpp's
        `use_extra_bufts`): repacked K-quant weights give a row results that depend on its place
        in a group of rows, so batching several sequences is exact only without (batch_probe.py)."""
        initialise_llama()
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.vocab_only = vocab_only
        params.use_extra_bufts = repack
        cancelled = False
        if progress is not None:

            def report(share: float, _data: object) -> bool:
                nonlocal cancelled
                cancelled = not progress(float(share))
                return not cancelled

            callback = llama_cpp.llama_progress_callback(report)
            params.progress_callback = callback  # kept alive by `callback` until the load returns
        with brisk_thread_switches() if progress is not None else contextlib.nullcontext():
            pointer = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
        if not pointer and cancelled:
            raise LoadCancelled(f"loading {path.name} was cancelled")
        if not pointer:
            raise ModelError(
                f"llama.cpp could not load {path} ({last_llama_problem()}); "
                "is it a complete GGUF file for an architecture this llama.cpp supports?"
            )
        self.path = path
        self.pointer = pointer
        self.vocab = llama_cpp.llama_model_get_vocab(pointer)
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(pointer))
        self.n_layer = int(llama_cpp.llama_model_n_layer(pointer))
        self.bos_id = int(llama_cpp.llama_vocab_bos(self.vocab))
        self.eos_id = int(llama_cpp.llama_vocab_eos(self.vocab))
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.window = max(0, int(llama_cpp.llama_model_n_swa(pointer))) if not vocab_only else 0
        kind = (
            MemoryKind.of(
                recurrent=bool(llama_cpp.llama_model_is_recurrent(pointer)),
                hybrid=bool(llama_cpp.llama_model_is_hybrid(pointer)),
                window=self.window,
            )
            if not vocab_only
            else MemoryKind.PLAIN
        )
        self.memory = memory_of(kind, self.window)  # what its sequence states hold and allow
        self._piece_buffer = ctypes.create_string_buffer(256)
        self._piece_lock = threading.Lock()
        if vocab_only:  # llama.cpp reads no hyperparameters then: the file's metadata says it
            trained = self.metadata(f"{self.metadata('general.architecture')}.context_length") or ""
            self.n_ctx_train = int(trained) if trained.isdigit() else 0
        self._compiled_grammars: OrderedDict[Grammar, None] = OrderedDict()  # known to compile, newest last
        self._grammars_lock = threading.Lock()

    def close(self) -> None:
        if self.pointer:
            llama_cpp.llama_model_free(self.pointer)
            self.pointer = None

    def _check_open(self) -> None:
        """A model used after it was freed would read freed memory (a crash): an error instead."""
        if not self.pointer:
            raise ModelError("the model was unloaded; send the request again")

    def check_grammar(self, grammar: Grammar) -> None:
        """GrammarError now, in the caller's thread, when llama.cpp would refuse `grammar` as the answer
        starts: a request at fault is then refused before its prompt is computed. A grammar that compiled
        once is not compiled again (an agent sends the same tools with every request)."""
        self._check_open()
        with self._grammars_lock:
            if grammar in self._compiled_grammars:
                self._compiled_grammars.move_to_end(grammar)
                return
        llama_cpp.llama_sampler_free(grammar_sampler(grammar, self))
        with self._grammars_lock:
            self._compiled_grammars[grammar] = None
            while len(self._compiled_grammars) > COMPILED_GRAMMARS_KEPT:
                self._compiled_grammars.popitem(last=False)

    def description(self) -> str:
        buffer = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self.pointer, buffer, ctypes.sizeof(buffer))
        return buffer.value.decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        """The default chat template from the GGUF metadata, if the model has one."""
        raw = llama_cpp.llama_model_chat_template(self.pointer, None)
        return raw.decode("utf-8") if raw else None

    def metadata(self, key: str) -> str | None:
        buffer = ctypes.create_string_buffer(4096)
        length = llama_cpp.llama_model_meta_val_str(self.pointer, key.encode("utf-8"), buffer, ctypes.sizeof(buffer))
        return buffer.value.decode("utf-8", errors="replace") if length >= 0 else None

    def facts(self) -> ModelFacts:
        """What the file's metadata says of the model, for the APIs that describe it."""
        file_type = self.metadata("general.file_type") or ""
        return ModelFacts(
            architecture=self.metadata("general.architecture") or "",
            parameters=int(llama_cpp.llama_model_n_params(self.pointer)),
            size_label=self.metadata("general.size_label") or "",
            quantization=quantization_name(int(file_type) if file_type.isdigit() else None),
            layers=self.n_layer,
        )

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids for `text`. Safe from any thread: it reads only the vocabulary."""
        self._check_open()
        data = text.encode("utf-8")
        capacity = len(data) + 8
        tokens = (llama_cpp.llama_token * capacity)()
        count = llama_cpp.llama_tokenize(self.vocab, data, len(data), tokens, capacity, add_special, parse_special)
        if count < 0:
            capacity = -count
            tokens = (llama_cpp.llama_token * capacity)()
            count = llama_cpp.llama_tokenize(self.vocab, data, len(data), tokens, capacity, add_special, parse_special)
        if count < 0:
            raise RuntimeError(f"llama.cpp failed to tokenize {len(data)} bytes")
        return list(tokens[:count])

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The bytes of one token (a piece may be part of a UTF-8 character)."""
        self._check_open()
        with self._piece_lock:
            buffer = self._piece_buffer
            length = llama_cpp.llama_token_to_piece(self.vocab, token, buffer, ctypes.sizeof(buffer), 0, special)
            if length < 0:
                buffer = ctypes.create_string_buffer(-length)
                length = llama_cpp.llama_token_to_piece(self.vocab, token, buffer, -length, 0, special)
            return buffer.raw[:length]

    def detokenize(self, tokens: list[int], *, special: bool = False) -> str:
        return b"".join(self.token_bytes(token, special=special) for token in tokens).decode("utf-8", errors="replace")

    def special_ids(self, texts: tuple[str, ...]) -> frozenset[int]:
        """The ids of those `texts` that are one token each, read as special tokens (Grammar.preserved)."""
        ids = (self.tokenize(text, add_special=False, parse_special=True) for text in texts)
        return frozenset(found[0] for found in ids if len(found) == 1)

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    @functools.cached_property
    def end_of_generation_ids(self) -> tuple[int, ...]:
        """Every token that ends an answer (EOS, EOT, `<|im_end|>`...): what `ignore_eos` forbids."""
        self._check_open()
        return tuple(token for token in range(self.n_vocab) if self.is_end_of_generation(token))

    def token_text(self, token: int) -> str:
        """A special token's literal text (such as `<|im_start|>`), for chat templates."""
        if token < 0:
            return ""
        return self.token_bytes(token, special=True).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ContextShape:
    """How a context was created: what the cache key and the scheduler need to know."""

    n_sequences: int
    n_ctx_per_sequence: int
    n_batch: int
    flash_attention: bool
    n_threads: int
    swa_full: bool = True
    kv_type: KvType = KvType.F16

    def window_cells(self, window: int) -> int:
        """The cells llama.cpp's sliding-window cache holds per sequence (llama_kv_cache_iswa): the whole
        context with swa_full, else one window and one batch, padded to 256 cells."""
        if self.swa_full:
            return self.n_ctx_per_sequence
        return min(self.n_ctx_per_sequence, -(-(window + self.n_batch) // 256) * 256)


class DecodeAborted(Exception):
    """llama_decode stopped early because the abort flag was raised."""


class NativeContext:
    """A llama.cpp context with one KV stream per sequence."""

    def __init__(
        self,
        model: NativeModel,
        *,
        n_sequences: int,
        n_ctx_per_sequence: int,
        n_threads: int,
        n_batch: int = 512,
        flash_attention: bool = False,
        kv_type: KvType = KvType.F16,
        swa_full: bool = True,
        should_abort: Callable[[], bool] = lambda: False,
    ) -> None:
        self.model = model

        # llama.cpp polls this during a decode, so a long prefill stops within milliseconds.
        def abort_now(_data: ctypes.c_void_p) -> bool:
            if should_abort():
                _abort_requested.set()
                return True
            return False

        self._abort_callback = llama_cpp.ggml_abort_callback(abort_now)
        self._no_abort_callback = llama_cpp.ggml_abort_callback()  # a NULL function pointer
        self.pointer = None
        # A build or model without flash attention falls back to off, but for a quantized KV type,
        # which needs it.
        attempts = [True] if kv_type.quantized else [True, False] if flash_attention else [False]
        for use_flash in attempts:
            params = llama_cpp.llama_context_default_params()
            params.n_ctx = n_sequences * n_ctx_per_sequence
            params.n_seq_max = n_sequences
            params.n_batch = n_batch
            params.n_ubatch = n_batch
            params.n_threads = n_threads
            params.n_threads_batch = n_threads
            params.kv_unified = False
            params.type_k = params.type_v = kv_type.ggml_type
            # A full-size sliding-window cache keeps every cell, so a cut anywhere stays exact;
            # off, it holds about one window per sequence (less memory, fewer cuts in place).
            params.swa_full = swa_full
            params.n_rs_seq = 0  # no recurrent rollback: a rollback after a later decode is silently wrong
            params.flash_attn_type = (
                llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if use_flash else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
            self.pointer = llama_cpp.llama_init_from_model(model.pointer, params)
            if self.pointer:
                break
        if not self.pointer:
            fix = (
                "set kv_type to f16, or lower context_cap or sequences"
                if kv_type.quantized
                else "lower context_cap or sequences"
            )
            raise ModelError(
                f"llama.cpp could not create a context of {n_sequences} x {n_ctx_per_sequence} tokens "
                f"{'of ' + kv_type.value + ' cells ' if kv_type.quantized else ''}({last_llama_problem()}); "
                f"{fix} in the settings"
            )
        self._abort_installed = False
        self.memory = llama_cpp.llama_get_memory(self.pointer)
        self.shape = ContextShape(
            n_sequences=int(llama_cpp.llama_n_seq_max(self.pointer)),
            n_ctx_per_sequence=int(llama_cpp.llama_n_ctx_seq(self.pointer)),
            n_batch=int(llama_cpp.llama_n_batch(self.pointer)),
            flash_attention=use_flash,
            n_threads=n_threads,
            swa_full=swa_full,
            kv_type=kv_type,
        )
        self._batch = llama_cpp.llama_batch_init(self.shape.n_batch, 0, 1)

    def close(self) -> None:
        if self.pointer:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.pointer)
            self.pointer = None

    def synchronize(self) -> None:
        """Wait for the work queued on the device (a decode may return before it is done there)."""
        if self.pointer:
            llama_cpp.llama_synchronize(self.pointer)

    def decode(self, tokens: list[int], *, start_pos: int, sequence: int, logits_for_last: bool) -> None:
        """Evaluate `tokens` at positions start_pos.. in `sequence` (at most n_batch tokens).

        Batches of several tokens can be interrupted by `should_abort`; single-token decodes
        are not (the answer loop checks between tokens, and a Python callback on every graph
        node would slow generation).
        """
        count = len(tokens)
        abortable = count > 1
        if abortable != self._abort_installed:
            llama_cpp.llama_set_abort_callback(
                self.pointer, self._abort_callback if abortable else self._no_abort_callback, None
            )
            self._abort_installed = abortable
        if not 0 < count <= self.shape.n_batch:
            raise ValueError(f"decode takes 1..{self.shape.n_batch} tokens, got {count}")
        batch = self._batch
        for index, token in enumerate(tokens):
            batch.token[index] = token
            batch.pos[index] = start_pos + index
            batch.n_seq_id[index] = 1
            batch.seq_id[index][0] = sequence
            batch.logits[index] = False
        batch.logits[count - 1] = logits_for_last
        batch.n_tokens = count
        try:
            status = llama_cpp.llama_decode(self.pointer, batch)
        finally:
            _abort_requested.clear()
        if status == 2:
            raise DecodeAborted()
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status} ({last_llama_problem()})")

    def decode_answers(self, entries: Sequence[tuple[int, int, int]]) -> None:
        """Evaluate one answer token of each of several sequences in one llama_decode: `entries` are
        (token, position, sequence), each with logits (row i for entry i). Not abortable, like any
        decode of one token per sequence. Exact beside decoding each alone only where the model's
        kernels are batch-invariant (batch_rule.py): the engine batches only what passed."""
        count = len(entries)
        if not 0 < count <= self.shape.n_batch:
            raise ValueError(f"decode takes 1..{self.shape.n_batch} tokens, got {count}")
        if self._abort_installed:
            llama_cpp.llama_set_abort_callback(self.pointer, self._no_abort_callback, None)
            self._abort_installed = False
        batch = self._batch
        for index, (token, position, sequence) in enumerate(entries):
            batch.token[index] = token
            batch.pos[index] = position
            batch.n_seq_id[index] = 1
            batch.seq_id[index][0] = sequence
            batch.logits[index] = True
        batch.n_tokens = count
        status = llama_cpp.llama_decode(self.pointer, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status} ({last_llama_problem()})")

    def logits_split_at(self, tokens: list[int], splits: list[int]) -> np.ndarray:
        """The last token's logits after evaluating `tokens` from nothing in sequence 0, in batches
        that end at `splits` (a diagnostic: does the split change them? see batching.py)."""
        self.remove(0, 0, -1)
        position = 0
        for end in [*splits, len(tokens)]:
            self.decode(tokens[position:end], start_pos=position, sequence=0, logits_for_last=end == len(tokens))
            position = end
        return self.logits()

    def logits_digest(self, row: int = -1) -> str:
        """A 128-bit hash of output `row`'s logits, read in place: equal digests are bit-identical logits."""
        pointer = llama_cpp.llama_get_logits_ith(self.pointer, row)
        return xxhash.xxh3_128_hexdigest(np.ctypeslib.as_array(pointer, shape=(self.model.n_vocab,)).data)

    def logits(self, row: int = -1) -> np.ndarray:
        """A copy of output `row`'s logits from the last decode (its last output by default)."""
        pointer = llama_cpp.llama_get_logits_ith(self.pointer, row)
        return np.ctypeslib.as_array(pointer, shape=(self.model.n_vocab,)).copy()

    def remove(self, sequence: int, start: int, end: int = -1) -> bool:
        """Drop the cells of `sequence` at positions [start, end); end -1 means to the end."""
        return bool(llama_cpp.llama_memory_seq_rm(self.memory, sequence, start, end))

    def max_position(self, sequence: int) -> int:
        """The largest position held by `sequence`, or -1 when it is empty."""
        return int(llama_cpp.llama_memory_seq_pos_max(self.memory, sequence))

    def min_position(self, sequence: int) -> int:
        """The smallest position `sequence` still holds (for a sliding window: its oldest cell), -1 when empty."""
        return int(llama_cpp.llama_memory_seq_pos_min(self.memory, sequence))


def grammar_sampler(grammar: Grammar, model: NativeModel) -> Any:
    """llama.cpp's grammar sampler; lazy (waiting for a trigger text) when the grammar has triggers."""
    text, root = grammar.gbnf.encode("utf-8"), grammar.root.encode("utf-8")
    if grammar.lazy:
        patterns = [pattern.encode("utf-8") for pattern in grammar.whole_text_patterns()]
        pattern_array = (ctypes.c_char_p * len(patterns))(*patterns)
        no_tokens = (llama_cpp.llama_token * 0)()
        pointer = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
            model.vocab, text, root, pattern_array, len(patterns), no_tokens, 0
        )
    else:
        pointer = llama_cpp.llama_sampler_init_grammar(model.vocab, text, root)
    if not pointer:
        # The parser's own reason goes to the process's stderr, not the log: only its last word comes here.
        raise GrammarError(f"llama.cpp refused the answer's grammar ({last_llama_problem()})")
    return pointer
