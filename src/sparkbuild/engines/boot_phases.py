"""Where a boot spent its time: the engine's phases (loading, profiling, KV cache, graph
capture, serving), read from its own log lines as they arrived.

Each adapter names the lines that open a phase (``EngineAdapter.boot_phases``, in the order
they are tried on a line); a boot starts in ``starting`` and is ``serving`` from its ready
line (or from the moment the run found it ready). A phase may come back (SGLang loads the
draft model after the target's KV pool): each stretch is its own entry, so a slow or stuck
boot says where it stopped and how long each part took. The memory guard asks the same
tracker which phase the engine is in at each sample.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sparkbuild.jsontext import JsonObject

STARTING = "starting"
SERVING = "serving"

PhasePatterns = Sequence[tuple[str, re.Pattern[str]]]


@dataclass(frozen=True)
class Phase:
    """One stretch of a boot: its phase, when it began (seconds from the start) and how long
    it lasted (None: it was still going when the run ended)."""

    name: str
    started_s: float
    seconds: float | None

    def to_json(self) -> JsonObject:
        return {
            "phase": self.name,
            "started_s": round(self.started_s, 2),
            "seconds": None if self.seconds is None else round(self.seconds, 2),
        }


class PhaseTracker:
    """Follows an engine's log line by line: the phase it is in, and every change."""

    def __init__(self, patterns: PhasePatterns, ready: re.Pattern[str], started_at: float) -> None:
        self.patterns = [*patterns, (SERVING, ready)]
        self.started_at = started_at
        self.changes: list[tuple[float, str]] = [(started_at, STARTING)]

    @property
    def current(self) -> str:
        return self.changes[-1][1]

    def feed(self, lines: Iterable[tuple[float, str]]) -> None:
        for at, line in lines:
            phase = next((name for name, pattern in self.patterns if pattern.search(line)), None)
            if phase is not None:
                self.enter(phase, at)

    def enter(self, phase: str, at: float) -> None:
        """``phase`` from ``at`` on (nothing changes when it is the current one)."""
        if phase != self.current:
            self.changes.append((max(at, self.changes[-1][0]), phase))

    def phases(self, ended_at: float | None = None) -> list[Phase]:
        """Every stretch, the last one open unless ``ended_at`` closes it (``serving`` is
        never closed: it is what the boot was for)."""
        stretches = []
        for (at, name), (until, _) in zip(
            self.changes, [*self.changes[1:], (None, "")], strict=True
        ):
            end = until if until is not None else (ended_at if name != SERVING else None)
            seconds = None if end is None else end - at
            stretches.append(Phase(name, at - self.started_at, seconds))
        return stretches


def boot_phases(
    stamped: Sequence[tuple[float, str]],
    patterns: PhasePatterns,
    ready: re.Pattern[str],
    started_at: float,
    *,
    ready_at: float | None = None,
    ended_at: float | None = None,
) -> list[Phase]:
    """The phases of a boot from its stamped log lines (``LogBuffer.stamped``); ``ready_at``:
    when the run found the engine ready (its ready line may come later, or never)."""
    tracker = PhaseTracker(patterns, ready, started_at)
    tracker.feed((at, line) for at, line in stamped if ready_at is None or at <= ready_at)
    if ready_at is not None:
        tracker.enter(SERVING, ready_at)
    return tracker.phases(ended_at)


def describe(phases: Sequence[Phase]) -> str:
    """``loading 12.1 s, kv cache 3.0 s, serving from 40.2 s``: one line for a report."""
    parts = []
    for phase in phases:
        if phase.name == SERVING:
            parts.append(f"serving from {phase.started_s:.1f} s")
        elif phase.seconds is None:
            parts.append(f"{phase.name} from {phase.started_s:.1f} s (not finished)")
        else:
            parts.append(f"{phase.name} {phase.seconds:.1f} s")
    return ", ".join(parts)


__all__ = ["SERVING", "STARTING", "Phase", "PhaseTracker", "boot_phases", "describe"]
