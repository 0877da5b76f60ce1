"""The source stage's view of the lock: what a ``--locked`` run must reproduce (the section a
resolved build writes is made in :mod:`~sparkbuild.source.record`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkbuild import console, lockfile
from sparkbuild.errors import LockError
from sparkbuild.settings import Settings
from sparkbuild.source.gencodes import STEP_VERSIONS
from sparkbuild.source.items import distinct_prefixes
from sparkbuild.spec import Build, file_sha256


@dataclass
class Pins:
    """What the lock pins for a ``--locked`` run (empty when resolving anew)."""

    commit: str | None = None
    pr_heads: dict[int, str] = field(default_factory=dict)
    pr_diffs: dict[int, str] = field(default_factory=dict)
    tree: str | None = None

    @classmethod
    def from_lock(cls, locked: lockfile.SourceSection) -> Pins:
        return cls(
            commit=locked.commit,
            tree=locked.tree,
            pr_heads=locked.pr_heads(),
            pr_diffs={p.number: p.diff_sha256 for p in locked.prs if p.diff_sha256},
        )


def read_lock(settings: Settings, lock: lockfile.LockFile | None) -> lockfile.LockFile:
    """``lock`` when the command already holds it, else the lock file as it is now."""
    return lock if lock is not None else lockfile.load(settings.lock_file)


def read_once(settings: Settings, *, locked: bool) -> lockfile.LockFile | None:
    """The lock, read once for a command that prepares several builds (not once a build).
    An unlocked run works with a damaged lock (that is how it is redone): warned once, then
    read as empty. A locked run gets None, so each build's own read names the error."""
    try:
        return lockfile.load(settings.lock_file)
    except LockError as exc:
        if locked:
            return None
        _ignored(settings, exc)
        return lockfile.empty()


def _ignored(settings: Settings, exc: LockError) -> None:
    console.warn(f"ignoring {settings.lock_file.name} for this unlocked run: {exc.message}")


def locked_heads(
    build: Build, settings: Settings, lock: lockfile.LockFile | None = None
) -> dict[int, str]:
    """PR heads the lock pins for ``build``, to mention when an unlocked run sees others.

    Only a note: an unlocked run must work with a damaged lock (that is how it is redone)."""
    try:
        entry = read_lock(settings, lock).entry(build.name)
    except LockError as exc:
        _ignored(settings, exc)
        return {}
    return entry.source.pr_heads() if entry and entry.source else {}


def staleness(build: Build, locked: lockfile.SourceSection | None) -> list[str]:
    """What differs between the spec and patch files and the locked source entry (offline)."""
    if locked is None:
        return [f"{build.name}: not in the lock"]
    problems: list[str] = []
    locked_patches = {p.file: p.sha256 for p in locked.patches}
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
    problems += _step_staleness(build, locked)
    locked_prs = {p.number for p in locked.prs}
    spec_prs = {pr.number for pr in build.prs}
    problems += [f"{build.name}: PR #{n} is not in the lock" for n in sorted(spec_prs - locked_prs)]
    problems += [
        f"{build.name}: PR #{n} was removed from the spec" for n in sorted(locked_prs - spec_prs)
    ]
    if locked.spec_digest != build.spec_digest() and not problems:
        problems.append(
            f"{build.name}: the spec changed since it was locked ({build.spec_file.name})"
        )
    return problems


def _step_staleness(build: Build, locked: lockfile.SourceSection) -> list[str]:
    locked_steps = {f"{s.step}:{s.file}": s for s in locked.steps}
    ids = [step.id for step in build.mode_steps()]
    problems = [f"{build.name}: step {i} is not in the lock" for i in ids if i not in locked_steps]
    problems += [
        f"{build.name}: step {i} was removed from the spec" for i in locked_steps if i not in ids
    ]
    for step_id, entry in locked_steps.items():
        current = STEP_VERSIONS.get(entry.step)
        if step_id in ids and entry.version != current:
            problems.append(
                f"{build.name}: step {step_id} changed since it was locked (version "
                f"{entry.version}, now {current})"
            )
    return problems


def require_locked_source(
    build: Build, settings: Settings, lock: lockfile.LockFile | None = None
) -> lockfile.SourceSection:
    entry = read_lock(settings, lock).entry(build.name)
    locked = entry.source if entry else None
    problems = staleness(build, locked)
    if problems or locked is None:
        raise LockError(
            "--locked, but the lock does not match:\n  " + "\n  ".join(problems),
            f"run `sparkbuild lock {build.name}` and commit images.lock",
        )
    return locked
