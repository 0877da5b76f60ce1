"""The memory floor: how little ``MemAvailable`` a node may be left with before the memory
guard (engines/memory_guard) stops the engine.

Written ``8`` or ``8GiB`` (GiB), ``512MiB``, ``5%`` (of the node's memory) or ``off``; on a
DGX Spark the default is the larger of 6 GiB and 5 % of the node's memory (what keeps the
driver and the OS room on a 119 GiB box: vLLM #46307 hung its host at ~7 GiB left); off a
Spark there is none unless asked (the guard still samples and records the peaks).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

SPARK_FLOOR_GIB = 6.0
SPARK_FLOOR_SHARE = 0.05
_FLOOR = re.compile(r"^\s*(\d{1,6}(?:\.\d{1,3})?)\s*(%|GiB|G|MiB|M)?\s*\Z", re.IGNORECASE)


@dataclass(frozen=True)
class MemoryFloor:
    """A floor as written: GiB, a share of the node's memory, or both (the larger wins)."""

    gib: float = 0.0
    share: float = 0.0
    text: str = "off"

    @property
    def off(self) -> bool:
        return self.gib <= 0 and self.share <= 0

    def for_total(self, total_gib: float) -> float | None:
        """The floor in GiB on a node of ``total_gib`` (None: no floor)."""
        if self.off:
            return None
        return max(self.gib, self.share * total_gib)


#: The default on a DGX Spark.
SPARK_DEFAULT = MemoryFloor(SPARK_FLOOR_GIB, SPARK_FLOOR_SHARE, "max(6 GiB, 5 % of memory)")
OFF = MemoryFloor()


def parse_floor(text: str) -> MemoryFloor:
    """``8``, ``8GiB``, ``512MiB``, ``5%`` or ``off``; a ValueError naming the forms."""
    if text.strip().lower() in ("off", "none", "0"):
        return OFF
    match = _FLOOR.match(text)
    if match is None:
        raise ValueError(
            f"{text!r} is not a memory floor: give GiB (8, 8GiB), MiB (512MiB), a share of "
            "the node's memory (5%) or off"
        )
    number, unit = float(match[1]), (match[2] or "GiB").lower()
    if not math.isfinite(number):
        raise ValueError(f"{text!r} is not a finite size")
    if unit == "%":
        if number > 100:
            raise ValueError(f"{text!r}: a share is at most 100%")
        return MemoryFloor(share=number / 100, text=text.strip())
    gib = number / 1024 if unit in ("mib", "m") else number
    return MemoryFloor(gib=gib, text=text.strip())


__all__ = ["OFF", "SPARK_DEFAULT", "MemoryFloor", "parse_floor"]
