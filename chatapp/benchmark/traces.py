"""Request traces for workload G: what a cache shared by many users sees over simulated days.

Each session picks a persona and (mostly) a document by Zipf-like popularity and asks a few
turns minutes apart; some sessions come back a day or more later (so the TTL matters). A request
is a chain of blocks: the persona's, then the document's (under that persona: a block's key names
its whole prefix), then the session's history so far. Variants add a scan (a burst of one-off
documents) and a popularity shift half-way (new favourites). Everything comes from one seeded
generator: a variant and a seed give the same trace on every machine.

Segments are whole blocks (a model of the block tree, not of token-exact cuts), so every block
holds `block_tokens` tokens and weighs the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

DAY_S = 24 * 3600.0
TRACE_VARIANTS = ("zipf", "scan", "shift", "mixed")
ROOT = -1


@dataclass(frozen=True)
class TraceShape:
    """The population and habits a trace is drawn from."""

    days: float = 10.0
    sessions: int = 900
    personas: int = 40
    documents: int = 300
    zipf_exponent: float = 1.0
    persona_blocks: tuple[int, int] = (4, 16)  # inclusive range, blocks
    document_blocks: tuple[int, int] = (8, 40)
    turns: tuple[int, int] = (1, 6)
    turn_blocks: tuple[int, int] = (1, 4)  # history added per turn (question and answer)
    with_document: float = 0.7  # share of sessions that ask about a document
    turn_gap_s: float = 180.0  # mean time between turns
    comeback: float = 0.2  # share of sessions resumed later
    comeback_days: tuple[float, float] = (0.5, 3.0)
    scan_sessions: int = 0  # one-off documents asked about in one burst
    scan_at: float = 0.4  # when the burst starts, as a share of the days
    scan_hours: float = 2.0
    shift: bool = False  # new popularity ranks for sessions after half-way
    block_tokens: int = 64
    seed: int = 14


def variant_shape(variant: str, scale: float = 1.0) -> TraceShape:
    """The shape of a named variant; `scale` shrinks the population and sessions (tests)."""
    base = TraceShape()
    base = replace(
        base,
        sessions=max(8, round(base.sessions * scale)),
        personas=max(3, round(base.personas * scale)),
        documents=max(5, round(base.documents * scale)),
    )
    scan = max(4, round(250 * scale))
    if variant == "zipf":
        return base
    if variant == "scan":
        return replace(base, scan_sessions=scan)
    if variant == "shift":
        return replace(base, shift=True)
    if variant == "mixed":
        return replace(base, scan_sessions=scan, shift=True)
    raise ValueError(f"unknown trace variant {variant!r}; choose one of {', '.join(TRACE_VARIANTS)}")


@dataclass
class Trace:
    """Blocks (parent, start token) and requests (time, chain of block ids from the root), in time order."""

    name: str
    shape: TraceShape
    parents: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    chains: list[list[int]] = field(default_factory=list)

    @property
    def blocks(self) -> int:
        return len(self.parents)

    @property
    def block_tokens(self) -> int:
        return self.shape.block_tokens

    @property
    def prompt_tokens(self) -> int:
        return sum(len(chain) for chain in self.chains) * self.block_tokens


class _Tree:
    """Block ids by (parent, label): equal prefixes get the same block."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self._ids: dict[tuple[int, tuple[object, ...]], int] = {}

    def chain(self, parent: int, start: int, labels: list[tuple[object, ...]]) -> list[int]:
        blocks = []
        for label in labels:
            block = self._ids.get((parent, label))
            if block is None:
                block = len(self.trace.parents)
                self._ids[(parent, label)] = block
                self.trace.parents.append(parent)
                self.trace.starts.append(start)
            blocks.append(block)
            parent, start = block, start + self.trace.block_tokens
        return blocks


def _popularity(rng: np.random.Generator, count: int, exponent: float) -> np.ndarray:
    """Zipf-like weights over `count` items in a random order (rank r weighs 1 / r^exponent)."""
    weights: np.ndarray = 1.0 / np.arange(1, count + 1, dtype=np.float64) ** exponent
    shuffled: np.ndarray = weights[rng.permutation(count)] / weights.sum()
    return shuffled


def make_trace(variant: str, scale: float = 1.0, seed: int | None = None) -> Trace:
    """The trace of a variant, drawn from its seed (the shape's unless given)."""
    shape = variant_shape(variant, scale)
    if seed is not None:
        shape = replace(shape, seed=seed)
    rng = np.random.default_rng(shape.seed)
    persona_sizes = rng.integers(shape.persona_blocks[0], shape.persona_blocks[1] + 1, shape.personas)
    document_sizes = rng.integers(shape.document_blocks[0], shape.document_blocks[1] + 1, shape.documents)
    early = (_popularity(rng, shape.personas, shape.zipf_exponent), _popularity(rng, shape.documents, 1.0))
    late = (_popularity(rng, shape.personas, shape.zipf_exponent), _popularity(rng, shape.documents, 1.0))
    span = shape.days * DAY_S
    sessions: list[tuple[float, int, int | None, int]] = []  # start, persona, document, turns
    for start in np.sort(rng.uniform(0, span, shape.sessions)):
        personas, documents = late if shape.shift and start >= span / 2 else early
        persona = int(rng.choice(shape.personas, p=personas))
        document = int(rng.choice(shape.documents, p=documents)) if rng.random() < shape.with_document else None
        sessions.append((float(start), persona, document, int(rng.integers(shape.turns[0], shape.turns[1] + 1))))
    burst = shape.scan_at * span
    for number, start in enumerate(np.sort(rng.uniform(burst, burst + shape.scan_hours * 3600, shape.scan_sessions))):
        persona = int(rng.choice(shape.personas, p=early[0]))
        sessions.append((float(start), persona, shape.documents + number, 1))  # a document asked about once

    trace = Trace(variant, shape)
    tree = _Tree(trace)
    requests: list[tuple[float, list[int]]] = []
    for number, (start, persona, document, turns) in enumerate(sessions):
        labels: list[tuple[object, ...]] = [("persona", persona, index) for index in range(persona_sizes[persona])]
        if document is not None:
            size = (
                document_sizes[document]
                if document < shape.documents
                else rng.integers(shape.document_blocks[0], shape.document_blocks[1] + 1)
            )
            labels += [("document", document, index) for index in range(int(size))]
        when = start
        comeback = rng.random() < shape.comeback and turns > 1
        resume_at = int(rng.integers(1, turns)) if comeback else turns
        for turn in range(turns):
            if turn == resume_at:
                when += float(rng.uniform(*shape.comeback_days)) * DAY_S
            elif turn > 0:
                when += float(rng.exponential(shape.turn_gap_s))
            # This turn's question and answer join the history: new in this request, reusable by the next.
            added = int(rng.integers(shape.turn_blocks[0], shape.turn_blocks[1] + 1))
            labels = labels + [("history", number, len(labels) + index) for index in range(added)]
            requests.append((when, tree.chain(ROOT, 0, labels)))
    requests.sort(key=lambda request: request[0])
    trace.times = [when for when, _ in requests]
    trace.chains = [chain for _, chain in requests]
    return trace
