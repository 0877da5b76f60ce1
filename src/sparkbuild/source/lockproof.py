"""Proving that images.lock tells the truth about a build's source, offline.

Checks used by ``--locked`` runs and by ``sparkbuild lock --check`` (which first checks the
file's shape with :func:`sparkbuild.lockfile.check`):

- :func:`check_ref`: the pinned ``commit:`` is what the spec's ``ref`` resolves to in the
  local mirror (a tag exactly; a branch contains it, since branches move on after locking);
- :func:`check_tree`: the patched tree sparkbuild just derived is the locked ``tree:``;
- :func:`check_fields`: every other recorded field (``repo``, ``ref``, ``version``,
  ``engine``, each PR's ``status``, ``head`` and ``commits``, each patch's ``status``, ...)
  is what the spec and the mirror give now; :func:`check_spec_fields` holds those the spec
  alone decides when no mirror holds the pinned commits, and :data:`UNPROVEN_OFFLINE` names
  the rest.

A lock edited by hand (another tag's commit, a tree of zeros, another repository, a PR's
status) fails one of them with the field named, instead of producing a different tree from
the old sources or recording what the sources do not say.
"""

from __future__ import annotations

from typing import Any

from sparkbuild import git
from sparkbuild.errors import LockError
from sparkbuild.lockfile import SourceSection
from sparkbuild.redact import strip_userinfo
from sparkbuild.source.mirror import Mirror, looks_like_sha
from sparkbuild.spec import Build, file_sha256

#: What only the mirror proves: named when ``lock --check`` finds no mirror to prove it with.
UNPROVEN_OFFLINE = (
    "commit",
    "tree",
    "prs[].status",
    "prs[].head",
    "prs[].commits",
    "prs[].diff_sha256",
    "patches[].status",
)


def _ref_tip(mirror: Mirror, name: str) -> str | None:
    result = git.run(
        ["rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"],
        git_dir=mirror.path,
        check=False,
    )
    return result.stdout.decode().strip() if result.returncode == 0 else None


def check_ref(mirror: Mirror, build: Build, commit: str) -> None:
    """Refuse a pinned ``commit`` that is not what ``build.ref`` resolves to in the mirror."""
    hint = (
        f"restore images.lock from git, or re-resolve with `sparkbuild lock {build.name}` and "
        "review the diff"
    )
    tag = _ref_tip(mirror, f"refs/tags/{build.ref}")
    if tag is not None:
        if tag != commit:
            raise LockError(
                f"{build.name}: images.lock pins commit {commit[:12]}, but tag {build.ref} is "
                f"{tag[:12]} (`builds.{build.name}.source.commit`)",
                hint,
            )
        return
    branch = _ref_tip(mirror, f"refs/remotes/origin/{build.ref}")
    if branch is not None:
        contained = git.run(
            ["merge-base", "--is-ancestor", commit, branch], git_dir=mirror.path, check=False
        )
        if contained.returncode != 0:
            raise LockError(
                f"{build.name}: images.lock pins commit {commit[:12]}, which is not on branch "
                f"{build.ref} (`builds.{build.name}.source.commit`)",
                hint,
            )
        return
    if looks_like_sha(build.ref):
        resolved = _ref_tip(mirror, build.ref)
        if resolved != commit:
            raise LockError(
                f"{build.name}: images.lock pins commit {commit[:12]}, but `ref: {build.ref}` "
                f"is {(resolved or 'not in the mirror')[:12]}",
                hint,
            )
        return
    raise LockError(
        f"{build.name}: ref {build.ref} is not in the mirror of {build.repo}, so the pinned "
        "commit cannot be checked",
        f"`sparkbuild prepare --locked {build.name}` fetches it",
    )


def check_tree(build: Build, locked: str | None, tree: str) -> None:
    """Refuse a derived patched ``tree`` that is not the locked one."""
    if locked != tree:
        raise LockError(
            f"{build.name}: the patched tree is {tree[:12]}, but images.lock pins "
            f"{str(locked)[:12]} (`builds.{build.name}.source.tree`); the lock does not "
            "describe these sources",
            f"restore images.lock from git, or re-pin with `sparkbuild lock {build.name}` and "
            "review the diff",
        )


def _hint(build: Build) -> str:
    return (
        f"restore images.lock from git, or re-pin with `sparkbuild lock {build.name}` and "
        "review the diff"
    )


def _differences(locked: object, derived: object, where: str) -> list[str]:
    """Paths of ``where`` whose recorded value differs from the derived one; a key the lock
    does not record (written by an older sparkbuild) is not compared."""
    if isinstance(locked, dict) and isinstance(derived, dict):
        return [
            path
            for key, value in locked.items()
            for path in _differences(value, derived.get(key), f"{where}.{key}")
        ]
    if (
        isinstance(locked, list)
        and isinstance(derived, list)
        and len(locked) == len(derived)
        and all(isinstance(item, dict) for item in locked)
    ):
        return [
            path
            for index, (item, now) in enumerate(zip(locked, derived, strict=True))
            for path in _differences(item, now, f"{where}[{index}]")
        ]
    return [] if locked == derived else [where]


def _refuse(build: Build, locked: object, derived: object, said_by: str) -> None:
    """A LockError naming every recorded field (dicts as ``to_json`` gives them) that differs
    from what ``said_by`` gives, and both values of the first."""
    fields = [path.lstrip(".") for path in _differences(locked, derived, "")]
    if not fields:
        return
    shown = [f"`builds.{build.name}.source.{path}`" for path in fields[:8]]
    more = f" and {len(fields) - 8} more" if len(fields) > 8 else ""
    first = fields[0]
    raise LockError(
        f"{build.name}: images.lock records fields that differ from {said_by}: "
        f"{', '.join(shown)}{more} ({first}: {_shown(locked, first)} in the lock, "
        f"{_shown(derived, first)} from {said_by})",
        _hint(build),
    )


def _shown(data: object, path: str) -> str:
    for part in filter(None, path.replace("[", ".[").split(".")):
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and part.startswith("[") and int(part[1:-1]) < len(data):
            data = data[int(part[1:-1])]
        else:
            data = None
    return repr(data)[:80]


def spec_fields(build: Build) -> dict[str, object]:
    """What the spec alone says a lock entry records (the PRs' and patches' own fields)."""
    return {
        "engine": build.engine,
        "repo": strip_userinfo(build.spec_repo),
        "ref": build.ref,
        "version": str(build.version),
        "spec_digest": build.spec_digest(),
        "prs": [{"number": pr.number, "when": pr.when} for pr in build.prs],
        "patches": [
            {"file": p.file, "when": p.when, "sha256": file_sha256(p.path)} for p in build.patches
        ],
    }


def _spec_part(recorded: dict[str, Any], keys: dict[str, Any]) -> dict[str, object]:
    """The part of a recorded entry that :func:`spec_fields` covers."""
    part = {key: recorded[key] for key in keys if key in recorded and key not in ("prs", "patches")}
    for items in ("prs", "patches"):
        if items in recorded and isinstance(recorded[items], list):
            wanted = keys[items][0].keys() if keys[items] else ()
            part[items] = [{k: item[k] for k in wanted if k in item} for item in recorded[items]]
    return part


def check_spec_fields(build: Build, locked: SourceSection) -> None:
    """Refuse a lock entry whose spec-given fields (repo, ref, version, engine, the PRs' and
    patches' own fields) are not what the spec says now."""
    expected = spec_fields(build)
    _refuse(build, _spec_part(locked.to_json(), expected), expected, "the spec")


def check_fields(build: Build, locked: SourceSection, derived: SourceSection) -> None:
    """Refuse a lock entry any recorded field of which differs from the section the source
    stage just derived from the spec and the mirror (``derived``)."""
    _refuse(build, locked.to_json(), derived.to_json(), "the spec and the mirror")


def mirror_has(mirror: Mirror, locked: SourceSection) -> bool:
    """Whether the mirror holds everything the locked entry pins (so it can be proven offline)."""
    if not mirror.trusted():
        return False
    wanted = [locked.commit, *(pr.head for pr in locked.prs)]
    return all(mirror.has_commit(sha) for sha in wanted if sha)


__all__ = [
    "UNPROVEN_OFFLINE",
    "check_fields",
    "check_ref",
    "check_spec_fields",
    "check_tree",
    "mirror_has",
    "spec_fields",
]
