"""Where a request's prompt goes in the context, and what of it is already computed.

Runs on the engine thread. For each request it compares the longest prefix already
resident in some sequence (tier "device": answered in place, nothing copied) with the
longest prefix stored in the cache (tiers "ram" and "disk": restored into a free or
least recently used sequence), takes the longer, and cuts the sequence at the first
token that differs. After the answer, the sequence's new blocks are handed to the
cache. Any failure to restore is a miss that leaves the sequence empty.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from cache.index import PrefixMatch
from cache.keys import as_token_array
from cache.llama_state import read_sequence_state, write_sequence_state
from cache.prefix_cache import PrefixCache
from cache.resident import ResidentSequences
from cache.state_format import StateFormatError, assemble_state
from chatapp.engine.llama_native import NativeContext
from chatapp.vocabulary import ReuseTier

log = logging.getLogger(__name__)

# Restoring costs a copy; prefer what is resident unless the cache has clearly more.
RESTORE_MARGIN_TOKENS = 8
# With logits, the last prompt tokens are always evaluated, and never one alone: llama.cpp
# computes a one-token batch with matrix-vector kernels whose results differ from a larger
# batch's, so a re-asked prompt evaluated from its last token could answer unlike a cold run.
FRESH_TOKENS = 2


@dataclass(frozen=True)
class Placement:
    sequence: int
    reused_tokens: int
    tier: ReuseTier


class KVPlacer:
    def __init__(self, context: NativeContext, cache: PrefixCache | None) -> None:
        self.context = context
        self.cache = cache
        self.resident = ResidentSequences(context.shape.n_sequences)

    def place(self, prompt: list[int], sequence: int | None, use_cache: bool, *, need_logits: bool = True) -> Placement:
        """Choose the sequence, restore or keep the longest known prefix, cut the rest.

        Without `need_logits` (a prefill-only warm-up) every prompt token may be reused, and a
        sequence that already holds the whole prompt is kept as it is, longer tail included.
        """
        limit = max(0, len(prompt) - FRESH_TOKENS) if need_logits else len(prompt)
        if not use_cache:
            target = self.resident.least_recently_used() if sequence is None else sequence
            return self._keep(target, 0, ReuseTier.NONE)
        array = as_token_array(prompt)
        if sequence is None:
            resident_sequence, resident_length = self.resident.best_match(array)
        else:
            resident_sequence, resident_length = sequence, self.resident.best_match_in(sequence, array)
        resident_length = min(resident_length, limit)
        if not need_logits and resident_length == len(prompt):
            self.resident.touch(resident_sequence)  # nothing to compute, nothing to cut
            return Placement(resident_sequence, resident_length, ReuseTier.DEVICE)
        if self.cache is not None:
            match = self.cache.lookup(array)
            if min(match.matched_tokens, limit) > resident_length + RESTORE_MARGIN_TOKENS:
                target = self.resident.least_recently_used() if sequence is None else sequence
                restored = self._restore(target, match, limit)
                if restored is not None and restored.reused_tokens > resident_length:
                    return restored
                if target == resident_sequence:
                    resident_length = 0  # the failed restore emptied it
        if resident_length > 0:
            return self._keep(resident_sequence, resident_length, ReuseTier.DEVICE)
        target = self.resident.least_recently_used() if sequence is None else sequence
        return self._keep(target, 0, ReuseTier.NONE)

    def _keep(self, sequence: int, length: int, tier: ReuseTier) -> Placement:
        if not self.context.remove(sequence, length, -1):
            # llama.cpp cannot cut this sequence (a recurrent or sliding-window memory): start over.
            self.forget(sequence)
            length = 0
        self.resident.truncate(sequence, length)
        self.resident.touch(sequence)
        return Placement(sequence, length, tier if length else ReuseTier.NONE)

    def _restore(self, sequence: int, match: PrefixMatch, limit: int) -> Placement | None:
        assert self.cache is not None
        fetched = self.cache.fetch(match)
        if fetched is None:
            return None
        try:
            state = assemble_state(
                self.cache.layout,
                list(zip((b.tokens.size for b in fetched.blocks), fetched.payloads, strict=True)),
                sequence,
            )
        except StateFormatError as error:
            log.warning("cannot assemble a cached prefix: %s", error)
            return None
        self.resident.replace(sequence, [])
        if not write_sequence_state(self.context.pointer, sequence, state):
            log.warning("llama.cpp refused a cached prefix; computing it instead")
            self.context.remove(sequence, 0, -1)
            return None
        self.resident.replace(sequence, fetched.tokens)
        return self._keep(sequence, min(fetched.matched_tokens, limit), fetched.tier)

    def forget(self, sequence: int) -> None:
        """Empty a sequence whose contents are in doubt."""
        self.context.remove(sequence, 0, -1)
        self.resident.replace(sequence, [])

    def save(self, sequence: int) -> None:
        """Hand the sequence's new blocks to the cache (reads its state; the rest is background work)."""
        tokens = self.resident.tokens[sequence]
        if self.cache is None or not tokens or not self.cache.has_new_blocks(tokens):
            return
        self.cache.store(list(tokens), read_sequence_state(self.context.pointer, sequence))
