"""The memory estimate held against what runs took: the last verdicts of a profile in
images.lock (smoke and bench records, with their ``hosts``), the most memory each run took on
a node (``MemAvailable`` at its start less the lowest the memory guard saw), and the
difference from what the estimate says the engine takes (its peak less what it leaves to the
host: ``Fit.peak_gib - Fit.reserve_gib``).

A measurement off a GB10 (the CPU engine in CI) is shown, and said not to be comparable: the
estimate is a Spark's.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkbuild.engines.memory_fit import Fit
from sparkbuild.jsontext import JsonObject
from sparkbuild.lockschema import HostRecord, LockFile

SHOWN = 3


@dataclass(frozen=True)
class Measured:
    """One verdict's measurement: which record, where, when, and the most it took."""

    kind: str  # smoke or bench
    build: str
    image_id: str
    read_at: str
    node: str
    taken_gib: float
    phase: str
    engine_version: str | None
    on_gb10: bool

    def difference(self, fit: Fit) -> float:
        return self.taken_gib - (fit.peak_gib - fit.reserve_gib)

    def to_json(self, fit: Fit) -> JsonObject:
        return {
            "kind": self.kind,
            "build": self.build,
            "image_id": self.image_id,
            "read_at": self.read_at,
            "node": self.node,
            "taken_gib": round(self.taken_gib, 2),
            "phase": self.phase,
            "engine_version": self.engine_version,
            "on_gb10": self.on_gb10,
            "estimate_gib": round(fit.peak_gib - fit.reserve_gib, 2),
            "difference_gib": round(self.difference(fit), 2),
        }

    def line(self, fit: Fit) -> str:
        where = "" if self.on_gb10 else "; measured off a GB10: not comparable"
        return (
            f"  {self.kind} {self.build} {self.image_id[:19]} ({self.read_at}, "
            f"{self.engine_version or 'version unknown'}) on {self.node}: took "
            f"{self.taken_gib:.2f} GiB at most ({self.phase}); the estimate's engine takes "
            f"{fit.peak_gib - fit.reserve_gib:.2f} GiB: {self.difference(fit):+.2f} GiB{where}"
        )


def _peak(hosts: HostRecord) -> tuple[str, float, str] | None:
    best: tuple[str, float, str] | None = None
    for node in hosts.nodes:
        for phase, gib in node.taken_gib.items():
            if best is None or gib > best[1]:
                best = (node.node, float(gib), phase)
    return best


def _gb10(hosts: HostRecord, node: str) -> bool:
    facts = next((n.facts for n in hosts.nodes if n.node == node), {})
    return "GB10" in facts.get("gpu", "")


def measurements(lock: LockFile, profile: str, version: str | None = None) -> list[Measured]:
    """The last :data:`SHOWN` measured runs of ``profile`` in ``lock`` (of ``version`` when
    given: a bench record, which names no version, is then left out), newest first."""
    found: list[Measured] = []
    for build, entry in lock.builds.items():
        for kind, keyed in (("smoke", entry.smoke or {}), ("bench", entry.bench or {})):
            for image_id, by_profile in keyed.items():
                record = by_profile.get(profile)
                hosts = getattr(record, "hosts", None)
                if hosts is None or (peak := _peak(hosts)) is None:
                    continue
                engine_version = getattr(record, "engine_version", None)
                if version is not None and engine_version != version:
                    continue
                node, taken, phase = peak
                when = hosts.read_at or ""
                on_gb10 = _gb10(hosts, node)
                found.append(
                    Measured(
                        kind, build, image_id, when, node, taken, phase, engine_version, on_gb10
                    )
                )
    found.sort(key=lambda m: m.read_at, reverse=True)
    return found[:SHOWN]


def describe(fit: Fit, measured: list[Measured]) -> list[str]:
    if not measured:
        return ["  measured: no verdict of this profile in images.lock records its memory"]
    return [f"measured (the last {len(measured)} in images.lock):"] + [
        m.line(fit) for m in measured
    ]


__all__ = ["Measured", "describe", "measurements"]
