"""``sparkbuild lock --check``: is images.lock a complete lock, and does it still describe the
specs and patches?

Offline and in order: the file's shape (:func:`sparkbuild.lockfile.check`), each build's
staleness against its spec and patch files (:func:`sparkbuild.source.pins.staleness`), and,
where the local mirror holds the pinned commits, a re-derivation of the patched tree
(:mod:`sparkbuild.source.lockproof`).
"""

from __future__ import annotations

from typing import NoReturn

from sparkbuild import console, git, lockfile
from sparkbuild.errors import LockError, MissingContentsError
from sparkbuild.settings import Settings
from sparkbuild.source import lockproof
from sparkbuild.source.items import FAILING
from sparkbuild.source.mirror import Mirror, trusted_mirrors
from sparkbuild.source.pins import staleness
from sparkbuild.source.prepare import prepare_source
from sparkbuild.spec import Build


def check_lock(settings: Settings, builds: list[Build], all_builds: bool) -> None:
    path = settings.lock_file
    if not path.exists():
        # Its own state, not staleness: a fresh clone or fork has no lock until the first
        # `sparkbuild lock` (or the images workflow's pull request) writes one.
        console.warn(
            f"no {path.name} yet: nothing to check against the {len(builds)} build(s); "
            "`sparkbuild lock` (or `nox -s lock`) writes it, then commit it"
        )
        return
    lock, problems = lockfile.check(path)  # the one read of the lock
    if problems or lock is None:
        _stale(problems, f"{path.name} is not a valid sparkbuild lock")
    for build in builds:
        entry = lock.entry(build.name)
        locked = entry.source if entry else None
        stale = staleness(build, locked)
        problems += stale or _prove_offline(settings, build, lock)
    if all_builds:
        known = {b.name for b in builds}
        problems += [
            f"{name}: in the lock but in no spec" for name in lock.builds if name not in known
        ]
    if problems:
        _stale(problems, f"{path.name} is stale")
    console.info(f"images.lock matches the specs ({len(builds)} build(s))")


def _unproven(settings: Settings, build: Build, locked: lockfile.SourceSection | None) -> str:
    """What is not proven offline, and why: no mirror of the build's URL holds the pinned
    commits. When another mirror in the cache does (the lock was made with ``--repo``), it
    is named with the command that proves them."""
    fields = ", ".join(lockproof.UNPROVEN_OFFLINE)
    other = _mirror_holding(settings, locked) if locked is not None else None
    if other is not None:
        return (
            f"{build.name}: not proven offline: {fields}. The pinned commits are in the "
            f"cache's mirror of {other}, not of {build.repo} (was it locked with --repo?); "
            f"`sparkbuild --repo {build.engine}={other} lock --check` proves them"
        )
    return (
        f"{build.name}: not proven offline (no mirror of {build.repo} in the cache holds the "
        f"pinned commits): {fields}; `sparkbuild prepare --locked {build.name}` fetches and "
        "proves them"
    )


def _mirror_holding(settings: Settings, locked: lockfile.SourceSection) -> str | None:
    """The URL of a mirror in the cache that holds the locked entry's commits, if any."""
    for path in trusted_mirrors(settings.cache_dir):
        url = (
            git.run(["config", "--get", "remote.origin.url"], git_dir=path, check=False)
            .stdout.decode(errors="replace")
            .strip()
        )
        if url and lockproof.mirror_has(Mirror(settings.cache_dir, url), locked):
            return url
    return None


def _prove_offline(settings: Settings, build: Build, lock: lockfile.LockFile) -> list[str]:
    """Re-derive the locked tree from the local mirror, when it holds the pinned commits."""
    entry = lock.entry(build.name)
    locked = entry.source if entry else None
    if locked is None or not lockproof.mirror_has(Mirror(settings.cache_dir, build.repo), locked):
        if locked is not None:
            try:
                lockproof.check_spec_fields(build, locked)
            except LockError as exc:
                return [exc.message]
        console.info(_unproven(settings, build, locked))
        return []
    try:
        prepared = prepare_source(build, settings, locked=True, offline=True, lock=lock)
    except LockError as exc:
        return [exc.message]
    except MissingContentsError:  # a partial mirror that never needed these files yet
        console.info(
            f"{build.name}: commit and tree not re-derived (the local mirror lacks file "
            f"contents it fetches on demand); `sparkbuild prepare --locked {build.name}` "
            "fetches and proves them"
        )
        return []
    failing = [f"{i.id} ({i.status})" for i in prepared.items if i.status in FAILING]
    return [f"{build.name}: does not apply offline: {', '.join(failing)}"] if failing else []


def _stale(problems: list[str], headline: str) -> NoReturn:
    raise LockError(
        f"{headline}:\n  " + "\n  ".join(problems),
        "run `sparkbuild lock` (or `nox -s lock`) and commit images.lock",
    )


__all__ = ["check_lock"]
