"""Figures of the cache's structure, beside the peers: lookup cost and storage overhead.

- Lookup (L): an index holding many conversations that share one persona; how long finding
  the longest stored prefix takes for a follow-up, for a new question on the persona, and for
  a prompt that matches nothing. No model is needed: this is the index a running app holds.
- Storage (S): conversations sharing one persona asked through chatapp's engine into a fresh
  cache folder; the folder's bytes against the KV bytes of the distinct tokens stored (every
  prompt and answer, shared prefixes counted once) plus, for a model whose state cannot be cut
  (a sliding window, a recurrent state), one checkpoint per conversation. Overheads are
  partial blocks, records, the database and the other checkpoints. The same conversations again
  for each KV type (kv_types.py): its bytes per token against f16's, and what it costs in answers
  (greedy, each type's against f16's: identical, and the share of tokens before they part).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from cache.blocks import BlockInfo
from cache.index import BlockIndex
from cache.keys import as_token_array
from chatapp.benchmark.goals import Verdict
from chatapp.benchmark.memory import folder_bytes
from chatapp.benchmark.peers import ChatappPeer, PeerSettings
from chatapp.benchmark.workloads import PromptKit
from chatapp.engine.opening import KvType
from chatapp.errors import ModelError
from chatapp.prompting.prompt import ChatMessage
from chatapp.vocabulary import Role

FIGURE_NAMES = ("L", "S")  # chosen with --workloads beside the peer workloads A-E
LOOKUP_TARGET_MS = 1.0  # p99 of one lookup among all the conversations
STORAGE_TARGET = 1.3  # folder bytes / KV bytes of the distinct tokens stored
CHECKPOINTED_STORAGE_TARGET = 1.5  # the same, with one checkpoint per conversation in the denominator
# A quantized type's KV bytes per token / f16's: ggml's blocks (34 and 18 bytes per 32 values, against 64).
KV_BYTES_TARGETS = {KvType.Q8_0: 0.55, KvType.Q4_0: 0.3}
VOCABULARY = 49152  # token ids drawn for the lookup index (any vocabulary size would do)
LOOKUPS = 2000


@dataclass(frozen=True)
class LookupFigures:
    conversations: int
    blocks: int
    build_s: float
    follow_up: dict[str, float]  # a stored conversation plus new tokens
    new_question: dict[str, float]  # the persona plus a new question
    no_match: dict[str, float]  # random tokens
    hashing_ms: float  # block keys of one whole prompt (what the store side does after each answer)


@dataclass(frozen=True)
class StorageWork:
    """What figure S asks: `conversations` questions on one persona, each answer at most `max_tokens`."""

    conversations: int
    persona_tokens: int
    question_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class StorageFigures:
    conversations: int
    distinct_tokens: int
    kv_bytes_per_token: int
    distinct_kv_bytes: int
    folder_bytes: int
    stored_payload_bytes: int
    blocks: int
    checkpoint_bytes: int = 0  # one checkpoint per conversation (0 for a plain KV cache)
    checkpoints: int = 0  # checkpoints stored
    kv_type: str = KvType.F16.value
    answers: tuple[tuple[int, ...], ...] = field(default=(), repr=False)  # greedy, one per conversation

    @property
    def ratio(self) -> float:
        wanted = self.distinct_kv_bytes + self.checkpoint_bytes
        return self.folder_bytes / wanted if wanted else float("nan")

    @property
    def target(self) -> float:
        return CHECKPOINTED_STORAGE_TARGET if self.checkpoint_bytes else STORAGE_TARGET


def measure_lookup(
    conversations: int, *, persona_tokens: int = 2000, question_tokens: int = 200, block_size: int = 64
) -> LookupFigures:
    """Build an index of `conversations` persona + question prompts, then time lookups in it."""
    rng = np.random.default_rng(7)
    persona = rng.integers(0, VOCABULARY, persona_tokens, dtype=np.int32)
    index = BlockIndex(block_size, seed=12345)
    started = time.perf_counter()
    stored = []
    for _ in range(conversations):
        tokens = np.concatenate([persona, rng.integers(0, VOCABULARY, question_tokens, dtype=np.int32)])
        stored.append(tokens)
        for key, parent, start, end in index.keys_for(tokens):
            if key not in index:
                index.add(BlockInfo(key, parent, start, tokens[start:end].copy(), 0, 0))
    build_s = time.perf_counter() - started

    def timed(prompts: list[np.ndarray]) -> dict[str, float]:
        times, matched = [], []
        for prompt in (p.tolist() for p in prompts):  # lookups start from a token list, as the engine's do
            began = time.perf_counter()
            match = index.longest_prefix(as_token_array(prompt))
            times.append((time.perf_counter() - began) * 1000)
            matched.append(match.matched_tokens)
        times.sort()
        return {
            "median_ms": times[len(times) // 2],
            "p99_ms": times[int(len(times) * 0.99)],
            "max_ms": times[-1],
            "median_matched_tokens": float(np.median(matched)),
        }

    def extra() -> np.ndarray:
        return rng.integers(0, VOCABULARY, question_tokens, dtype=np.int32)

    follow_up = timed([np.concatenate([stored[i * 37 % conversations], extra()]) for i in range(LOOKUPS)])
    new_question = timed([np.concatenate([persona, extra()]) for _ in range(LOOKUPS)])
    no_match = timed(
        [rng.integers(0, VOCABULARY, persona_tokens + question_tokens, dtype=np.int32) for _ in range(LOOKUPS)]
    )
    sample = stored[: min(200, conversations)]
    began = time.perf_counter()
    for tokens in sample:
        index.keys_for(tokens)
    hashing_ms = (time.perf_counter() - began) * 1000 / len(sample)
    return LookupFigures(conversations, len(index), build_s, follow_up, new_question, no_match, hashing_ms)


def distinct_tokens(sequences: list[tuple[int, ...]]) -> int:
    """Distinct prefix positions over all sequences: the size of their token trie."""
    total = 0
    arrays = [as_token_array(sequence) for sequence in sequences]
    for number, array in enumerate(arrays):
        shared = 0
        for earlier in arrays[:number]:
            limit = min(earlier.size, array.size)
            differ = np.flatnonzero(earlier[:limit] != array[:limit])
            shared = max(shared, int(differ[0]) if differ.size else limit)
        total += array.size - shared
    return total


@dataclass(frozen=True)
class StorageByType:
    """Figure S for each KV type, the same conversations in a folder each; f16 is the reference."""

    figures: dict[str, StorageFigures]
    refused: dict[str, str]  # a type the model cannot take, and llama.cpp's reason

    @property
    def reference(self) -> StorageFigures:
        return self.figures[KvType.F16]

    def bytes_ratio(self, kv_type: str) -> float:
        reference = self.reference.kv_bytes_per_token  # 0 for a recurrent model: no KV in blocks
        return self.figures[kv_type].kv_bytes_per_token / reference if reference else float("nan")

    def agreement(self, kv_type: str) -> tuple[int, float]:
        """Answers identical to f16's, and the mean share of each answer's tokens before it parts from f16's."""
        pairs = list(zip(self.reference.answers, self.figures[kv_type].answers, strict=True))
        identical = sum(ours == theirs for ours, theirs in pairs)
        shares = [_common_prefix(ours, theirs) / max(len(ours), len(theirs), 1) for ours, theirs in pairs]
        return identical, sum(shares) / len(shares) if shares else float("nan")


def _common_prefix(left: tuple[int, ...], right: tuple[int, ...]) -> int:
    for index, (a, b) in enumerate(zip(left, right, strict=False)):
        if a != b:
            return index
    return min(len(left), len(right))


def measure_storage_by_type(
    settings: PeerSettings,
    kit: PromptKit,
    folder: Path,
    work: StorageWork,
    kv_types: tuple[KvType, ...] = tuple(KvType),
) -> StorageByType:
    """`measure_storage` for f16 and then each other type of `kv_types` the model takes."""
    figures: dict[str, StorageFigures] = {}
    refused: dict[str, str] = {}
    for kv_type in (KvType.F16, *(kind for kind in kv_types if kind is not KvType.F16)):
        typed = replace(settings, kv_type=kv_type)
        try:
            figures[kv_type] = measure_storage(typed, kit, folder / kv_type.value, work)
        except ModelError as error:  # heads whose size is not a multiple of the type's block
            if not kv_type.quantized:
                raise  # the reference itself: nothing to compare with
            refused[kv_type] = str(error)
    return StorageByType(figures, refused)


def measure_storage(
    settings: PeerSettings,
    kit: PromptKit,
    folder: Path,
    work: StorageWork,
) -> StorageFigures:
    """Ask `work.conversations` questions on one persona through chatapp, then weigh its cache folder."""
    conversations, question_tokens, max_tokens = work.conversations, work.question_tokens, work.max_tokens
    persona = kit.texts.persona(4, work.persona_tokens)
    prompts = [
        kit.build(
            [
                ChatMessage.of(Role.SYSTEM, persona),
                ChatMessage.of(Role.USER, kit.texts.question(1000 + number, question_tokens)),
            ]
        )
        for number in range(conversations)
    ]
    peer = ChatappPeer(settings, folder)
    sequences = []
    try:
        for prompt in prompts:
            answer = peer.ask(prompt, max_tokens)
            sequences.append(prompt + tuple(answer.token_ids or ()))
        peer.settle()
        cache = peer.engine.cache
        assert cache is not None
        layout = cache.layout
        per_token = layout.bytes_per_cell
        payload = sum(info.payload_size for info in cache.index.everything())
        blocks = len(cache.index.entries)
        checkpoints = len(cache.index.checkpoints)
        one_checkpoint = sum(
            min(layout.window, len(sequence)) * layout.window_bytes_per_cell + layout.recurrent_size
            for sequence in sequences
        )
    finally:
        peer.close()
    distinct = distinct_tokens(sequences)
    return StorageFigures(
        conversations=conversations,
        distinct_tokens=distinct,
        kv_bytes_per_token=per_token,
        distinct_kv_bytes=distinct * per_token,
        folder_bytes=folder_bytes(folder),
        stored_payload_bytes=payload,
        blocks=blocks,
        checkpoint_bytes=one_checkpoint if layout.memory.restores_at_checkpoints else 0,
        checkpoints=checkpoints,
        kv_type=settings.kv_type.value,
        answers=tuple(sequence[len(prompt) :] for prompt, sequence in zip(prompts, sequences, strict=True)),
    )


def cache_figure_verdicts(lookup: LookupFigures | None, by_type: StorageByType | None) -> list[Verdict]:
    """The structure goals: a lookup well under a millisecond, storage close to the KV bytes themselves,
    and quantized types as small as their blocks."""
    verdicts = []
    if lookup is not None:
        worst = max(lookup.follow_up["p99_ms"], lookup.new_question["p99_ms"], lookup.no_match["p99_ms"])
        verdicts.append(
            Verdict(
                "L",
                f"p99 lookup among {lookup.conversations:,} conversations (ms)",
                worst,
                f"<= {LOOKUP_TARGET_MS:g}",
                worst <= LOOKUP_TARGET_MS,
            )
        )
    if by_type is not None:
        storage = by_type.reference
        verdicts.append(
            Verdict(
                "S",
                f"folder bytes / distinct KV bytes{' + a checkpoint each' if storage.checkpoint_bytes else ''}, "
                f"{storage.conversations} conversations",
                storage.ratio,
                f"<= {storage.target:g}",
                storage.ratio <= storage.target,
            )
        )
        for kv_type, target in KV_BYTES_TARGETS.items():
            if kv_type in by_type.figures:
                ratio = by_type.bytes_ratio(kv_type)
                name = f"{kv_type} KV bytes per token / f16"
                verdicts.append(Verdict("S", name, ratio, f"<= {target:g}", ratio <= target))
    return verdicts


def figures_record(lookup: LookupFigures | None, by_type: StorageByType | None) -> dict[str, Any]:
    """For bench.json."""
    record: dict[str, Any] = {}
    if lookup is not None:
        record["lookup"] = asdict(lookup)
    if by_type is not None:
        record["storage"] = _storage_record(by_type.reference)
        record["storage_by_kv_type"] = {
            kv_type: {
                **_storage_record(figures),
                "bytes_per_token_of_f16": by_type.bytes_ratio(kv_type),
                "answers_like_f16": by_type.agreement(kv_type)[0],
                "tokens_agreeing_with_f16": by_type.agreement(kv_type)[1],
            }
            for kv_type, figures in by_type.figures.items()
        }
        record["storage_refused_kv_types"] = by_type.refused
    return record


def _storage_record(figures: StorageFigures) -> dict[str, Any]:
    fields = {name: value for name, value in asdict(figures).items() if name != "answers"}
    return {**fields, "ratio": figures.ratio}


def figures_table(lookup: LookupFigures | None, by_type: StorageByType | None) -> str:
    """A few lines for the terminal."""
    lines = []
    if lookup is not None:
        lines.append(
            f"L  lookup among {lookup.conversations:,} conversations ({lookup.blocks:,} blocks, built in "
            f"{lookup.build_s:.1f} s): median / p99 ms"
        )
        for name, figures in (
            ("follow-up of a stored conversation", lookup.follow_up),
            ("new question on the shared persona", lookup.new_question),
            ("nothing matches", lookup.no_match),
        ):
            lines.append(
                f"     {name:36} {figures['median_ms']:7.3f} / {figures['p99_ms']:7.3f}  "
                f"(matched {figures['median_matched_tokens']:,.0f} tokens)"
            )
        lines.append(f"     block keys of one prompt (store side) {lookup.hashing_ms:7.3f} ms")
    if by_type is not None:
        lines.extend(_storage_lines(by_type))
    return "\n".join(lines)


def _storage_lines(by_type: StorageByType) -> list[str]:
    storage, mib = by_type.reference, 1 << 20
    lines = [
        f"S  storage, {storage.conversations} conversations on one persona: {storage.distinct_tokens:,} distinct "
        f"tokens x {storage.kv_bytes_per_token:,} B = {storage.distinct_kv_bytes / mib:.1f} MiB; folder "
        f"{storage.folder_bytes / mib:.1f} MiB ({storage.ratio:.3f}x), payloads "
        f"{storage.stored_payload_bytes / mib:.1f} MiB in {storage.blocks:,} blocks"
        + (
            f" and {storage.checkpoints:,} checkpoints (one per conversation: {storage.checkpoint_bytes / mib:.1f} MiB)"
            if storage.checkpoint_bytes
            else ""
        )
    ]
    for kv_type, figures in by_type.figures.items():
        if kv_type == KvType.F16:
            continue
        identical, share = by_type.agreement(kv_type)
        lines.append(
            f"   {kv_type:>5}: {figures.kv_bytes_per_token:,} B per token ({by_type.bytes_ratio(kv_type):.3f}x f16), "
            f"folder {figures.folder_bytes / mib:.1f} MiB ({figures.ratio:.3f}x its KV bytes); answers like f16's "
            f"{identical} of {len(figures.answers)}, {share:.0%} of tokens before they part"
        )
    lines.extend(f"   {kv_type:>5}: not measured ({why})" for kv_type, why in by_type.refused.items())
    return lines
