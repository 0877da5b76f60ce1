"""The source stage's view of the lock: what a ``--locked`` run must reproduce, and the
section a resolved build writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparkbuild import console
from sparkbuild import lock as lockfile
from sparkbuild.errors import LockError
from sparkbuild.settings import Settings
from sparkbuild.source.items import PreparedSource, distinct_prefixes
from sparkbuild.spec import Build, file_sha256
from sparkbuild.validate import strip_userinfo


@dataclass
class Pins:
    """What the lock pins for a ``--locked`` run (empty when resolving anew)."""

    commit: str | None = None
    pr_heads: dict[int, str] = field(default_factory=dict)
    pr_diffs: dict[int, str] = field(default_factory=dict)
    tree: str | None = None

    @classmethod
    def from_lock(cls, entry: dict[str, Any]) -> Pins:
        prs = entry.get("prs", [])
        return cls(
            commit=entry.get("commit"),
            tree=entry.get("tree"),
            pr_heads={p["number"]: p["head"] for p in prs if p.get("head")},
            pr_diffs={p["number"]: p["diff_sha256"] for p in prs if p.get("diff_sha256")},
        )


def locked_heads(build: Build, settings: Settings) -> dict[int, str]:
    """PR heads the lock pins for ``build``, to mention when an unlocked run sees others.

    Only a note: an unlocked run must work with a damaged lock (that is how it is redone)."""
    try:
        entry = lockfile.build_entry(lockfile.load(settings.lock_file), build.name)
    except LockError as exc:
        console.warn(f"ignoring {settings.lock_file.name} for this unlocked run: {exc.message}")
        return {}
    source = entry.get("source") if entry else None
    return Pins.from_lock(source).pr_heads if isinstance(source, dict) else {}


def lock_section(prepared: PreparedSource) -> dict[str, Any]:
    build = prepared.build
    return {
        "engine": build.engine,
        "repo": strip_userinfo(build.spec_repo),  # a token in the spec never reaches the lock
        "ref": build.ref,
        "commit": prepared.base_commit,
        "version": str(build.version),
        "spec_digest": build.spec_digest(),
        "tree": prepared.tree,
        "prs": [
            {
                k: v
                for k, v in item.to_json().items()
                if k in ("number", "when", "status", "head", "commits", "diff_sha256")
            }
            for item in prepared.items
            if item.kind == "pr"
        ],
        "patches": [
            {k: v for k, v in item.to_json().items() if k in ("file", "when", "status", "sha256")}
            for item in prepared.items
            if item.kind == "patch"
        ],
    }


def staleness(build: Build, entry: dict[str, Any] | None) -> list[str]:
    """What differs between the spec and patch files and the locked source entry (offline)."""
    if entry is None:
        return [f"{build.name}: not in the lock"]
    problems: list[str] = []
    locked_patches = {p["file"]: p.get("sha256") for p in entry.get("patches", [])}
    for patch in build.patches:
        if patch.file not in locked_patches:
            problems.append(f"{build.name}: patch {patch.file} is not in the lock")
            continue
        current = file_sha256(patch.path)
        if current is None:
            problems.append(f"{build.name}: patch {patch.file} is missing")
        elif locked_patches[patch.file] and current != locked_patches[patch.file]:
            locked_sha = str(locked_patches[patch.file])
            now, then = distinct_prefixes(current, locked_sha)
            problems.append(
                f"{build.name}: patch {patch.file} changed (sha256 {now}, locked {then})"
            )
    for file in set(locked_patches) - {p.file for p in build.patches}:
        problems.append(f"{build.name}: patch {file} was removed from the spec")
    locked_prs = {p["number"] for p in entry.get("prs", [])}
    spec_prs = {pr.number for pr in build.prs}
    problems += [f"{build.name}: PR #{n} is not in the lock" for n in sorted(spec_prs - locked_prs)]
    problems += [
        f"{build.name}: PR #{n} was removed from the spec" for n in sorted(locked_prs - spec_prs)
    ]
    if entry.get("spec_digest") != build.spec_digest() and not problems:
        problems.append(
            f"{build.name}: the spec changed since it was locked ({build.spec_file.name})"
        )
    return problems


def require_locked_source(build: Build, settings: Settings) -> dict[str, Any]:
    entry = lockfile.build_entry(lockfile.load(settings.lock_file), build.name)
    source = entry.get("source") if entry else None
    problems = staleness(build, source)
    if problems:
        raise LockError(
            "--locked, but the lock does not match:\n  " + "\n  ".join(problems),
            f"run `sparkbuild lock {build.name}` and commit images.lock",
        )
    assert isinstance(source, dict)
    return source


def record(prepared: PreparedSource, settings: Settings) -> None:
    lockfile.set_section(settings.lock_file, prepared.build.name, "source", lock_section(prepared))
