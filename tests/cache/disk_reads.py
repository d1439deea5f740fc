"""A disk tier's payloads read back as a restore reads them, for tests that check what it holds."""

from __future__ import annotations

from collections.abc import Sequence

from cache.blocks import BlockInfo
from cache.disk_tier import DiskTier
from cache.tier import Payload


def read_back(tier: DiskTier, infos: Sequence[BlockInfo]) -> list[bytes | None]:
    """Each entry's payload (None where the tier does not hold it intact and unexpired)."""
    got: list[bytes | None] = [None] * len(infos)

    def keep(index: int, payload: Payload) -> None:
        got[index] = bytes(payload)

    tier.read_into(infos, keep, keep=True)
    return got
