"""Where a reused prefix came from: the names of the cache's tiers, one vocabulary everywhere."""

from __future__ import annotations

from enum import StrEnum


class ReuseTier(StrEnum):
    """The tier that supplied a request's reused prefix (NONE: nothing was reused)."""

    NONE = "none"
    DEVICE = "device"  # resident in a llama.cpp sequence: answered in place, nothing copied
    RAM = "ram"  # restored from host memory
    DISK = "disk"  # restored from the disk tier
    SERVER = "server"  # reused by a remote engine's own prefix cache (it does not say from where)
    UNREPORTED = "unreported"  # a remote engine that does not say what it reused


REUSING_TIERS = (ReuseTier.DEVICE, ReuseTier.RAM, ReuseTier.DISK)
