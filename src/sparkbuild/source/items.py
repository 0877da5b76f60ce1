"""What the source stage produces: one result per PR, patch or step, and the patched tree."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sparkbuild import git
from sparkbuild.checks import ItemStatus
from sparkbuild.jsontext import JsonObject
from sparkbuild.source.mirror import complete
from sparkbuild.spec import Build

Status = ItemStatus  # what the lock records of each item
FAILING: frozenset[str] = frozenset({"conflict", "missing", "invalid"})


@dataclass(frozen=True)
class ItemResult:
    kind: Literal["pr", "patch", "step"]
    id: str
    status: Status
    detail: str
    files: tuple[str, ...] = ()
    when: str | None = None
    # PRs
    number: int | None = None
    head: str | None = None
    commits: tuple[str, ...] = ()
    diff_sha256: str | None = None
    # patches (and steps: the upstream file they edit)
    file: str | None = None
    sha256: str | None = None
    # steps
    step: str | None = None
    step_version: int | None = None  # of the step's code, recorded in the lock
    # the diff itself, kept for conflict hand-off; not serialised
    diff: bytes = field(default=b"", repr=False, compare=False)
    # a conflict's: the scratch commit it failed on (earlier conflicts left out); not serialised
    before_commit: str | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> JsonObject:
        data: JsonObject = {
            "kind": self.kind,
            "id": self.id,
            "status": self.status,
            "detail": self.detail,
            "files": list(self.files),
            "when": self.when,
        }
        if self.kind == "pr":
            data.update(
                number=self.number,
                head=self.head,
                commits=list(self.commits),
                diff_sha256=self.diff_sha256,
            )
        elif self.kind == "step":
            data.update(step=self.step, file=self.file)
        else:
            data.update(file=self.file, sha256=self.sha256)
        return data


@dataclass(frozen=True)
class ChangedFile:
    path: str
    status: Literal["A", "M", "D"]


@dataclass(frozen=True)
class PreparedSource:
    build: Build
    base_commit: str
    tree: str  # the patched tree; equals the base tree when nothing applied
    head_commit: str  # sparkbuild's scratch commit of ``tree`` (history: one commit per item)
    items: tuple[ItemResult, ...]
    changed: tuple[ChangedFile, ...]
    mirror: Path
    conflict_commit: str | None = None  # the last good commit before the first conflict

    @property
    def ok(self) -> bool:
        return not any(item.status in FAILING for item in self.items)

    def export(self, dest: Path, paths: Iterable[str] | None = None) -> None:
        """Write the patched tree (or only ``paths`` of it) into ``dest``."""
        selected = list(paths) if paths is not None else []
        if paths is not None and not selected:
            return
        complete(self.mirror, self.tree, selected or None)
        archive = git.run(
            ["archive", "--format=tar", self.tree, "--", *selected], git_dir=self.mirror
        ).stdout
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="tar")

    def to_json(self) -> JsonObject:
        return {
            "build": self.build.name,
            "engine": self.build.engine,
            "version": str(self.build.version),
            "ref": self.build.ref,
            "base_commit": self.base_commit,
            "tree": self.tree,
            "ok": self.ok,
            "items": [item.to_json() for item in self.items],
            "changed": [{"path": c.path, "status": c.status} for c in self.changed],
        }


def distinct_prefixes(a: str, b: str, shortest: int = 12) -> tuple[str, str]:
    """Short forms of two hashes that still differ (a lock cut short shares a prefix)."""
    length = shortest
    while length < max(len(a), len(b)) and a[:length] == b[:length]:
        length += 8
    return a[:length], b[:length]
