"""What ``sparkbuild bump`` passes between its parts: one :class:`Decision` per item, the
:class:`BumpContext` the decisions are taken in, and the :class:`BumpPlan` they make.

Kept apart from the parts that make them (:mod:`decide`, :mod:`plan`) and the ones that
read them (:mod:`write`, :mod:`report`), so no part of bump imports another in a circle.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from packaging.version import Version

from sparkbuild import source
from sparkbuild.jsontext import Fields, JsonObject
from sparkbuild.settings import Settings
from sparkbuild.source.mirror import Mirror
from sparkbuild.spec import Build

Action = Literal[
    "keep", "upstream", "follow-range", "out-of-range", "regenerated", "conflict", "missing"
]
CARRIED: frozenset[str] = frozenset({"keep", "regenerated", "conflict", "missing"})


@dataclass(frozen=True)
class Decision(Fields):
    """What bump does with one PR, patch or source step of the ``--from`` build."""

    kind: Literal["pr", "patch", "step"]
    id: str
    scope: Literal["spec", "build"]  # a file-level item or one of the build's own
    index: int  # position in that scope's `prs` or `patches` list
    status_from: str
    status_to: str
    action: Action
    detail: str
    when: str | None = None
    new_when: str | None = None  # the existing entry's `when` after the bump, if changed
    variant_file: str | None = None
    variant_when: str | None = None
    strategy: str | None = None
    report_file: str | None = None


@dataclass(frozen=True)
class BumpContext:
    """The two prepared releases and what the decisions have produced so far."""

    settings: Settings
    mirror: Mirror
    from_prepared: source.PreparedSource
    to_prepared: source.PreparedSource
    tags: dict[Version, str]
    tag: str
    to: Version
    new_build: str
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class BumpPlan:
    engine: str
    from_build: Build
    to_version: Version
    tag: str
    new_build: str
    decisions: list[Decision]
    spec_file: Path
    spec_before: str
    spec_after: str
    files: dict[str, bytes] = field(default_factory=dict)  # project-relative path -> bytes
    notes: list[str] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)  # newer builds this bump breaks
    verified: source.PreparedSource | None = None
    unloadable: str | None = None  # why the planned spec does not load, if it does not

    @property
    def ready(self) -> bool:
        planned_ok = not any(d.action in ("conflict", "missing") for d in self.decisions)
        return (
            planned_ok and not self.regressions and self.verified is not None and self.verified.ok
        )

    def spec_diff(self) -> str:
        name = str(self.spec_file.name)
        lines = difflib.unified_diff(
            self.spec_before.splitlines(keepends=True),
            self.spec_after.splitlines(keepends=True),
            f"a/builds/{name}",
            f"b/builds/{name}",
        )
        return "".join(lines)

    def counts(self) -> dict[str, int]:
        counted: dict[str, int] = {}
        for decision in self.decisions:
            counted[decision.action] = counted.get(decision.action, 0) + 1
        return counted

    def to_json(self) -> JsonObject:
        return {
            "engine": self.engine,
            "from": self.from_build.name,
            "from_version": str(self.from_build.version),
            "to": str(self.to_version),
            "ref": self.tag,
            "build": self.new_build,
            "ready": self.ready,
            "regressions": list(self.regressions),
            "counts": self.counts(),
            "items": [d.to_json() for d in self.decisions],
            "notes": list(self.notes),
            "spec_file": str(self.spec_file),
            "spec_diff": self.spec_diff(),
            "files": {path: data.decode(errors="replace") for path, data in self.files.items()},
            "verified": self.verified.to_json() if self.verified else None,
        }
