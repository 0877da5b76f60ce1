"""Proving that images.lock tells the truth about a build's source, offline.

Three checks, used by ``--locked`` runs and by ``sparkbuild lock --check``:

- :func:`schema_problems`: the file's shape, including ``schema:`` itself (a lock without it,
  or from another schema version, is not read as if it were ours);
- :func:`check_ref`: the pinned ``commit:`` is what the spec's ``ref`` resolves to in the
  local mirror (a tag exactly; a branch contains it, since branches move on after locking);
- :func:`check_tree`: the patched tree sparkbuild just derived is the locked ``tree:``.

A lock edited by hand (another tag's commit, a tree of zeros) fails one of them with the
field named, instead of producing a different tree from the old sources.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sparkbuild import git, yamlfile
from sparkbuild import lock as lockfile
from sparkbuild.errors import BadYAMLError, LockError
from sparkbuild.lock import SCHEMA
from sparkbuild.source.mirror import Mirror, looks_like_sha
from sparkbuild.spec import Build

_GIT_SHA = re.compile(r"^[0-9a-f]{40}$|^[0-9a-f]{64}$")  # SHA-1 or SHA-256 object names
GitSha = Annotated[str, Field(pattern=_GIT_SHA.pattern)]
Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
ImageDigest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


class _Open(BaseModel):
    # Other stages may add keys; only the fields named here are held to a shape.
    model_config = ConfigDict(extra="allow", strict=True)


class _LockedPR(_Open):
    number: int
    status: str
    head: GitSha | None = None
    commits: list[GitSha] = []
    diff_sha256: Sha256Hex | None = None
    when: str | None = None


class _LockedPatch(_Open):
    file: str
    status: str
    sha256: Sha256Hex | None = None
    when: str | None = None


class _LockedSource(_Open):
    engine: str
    repo: str
    ref: str
    commit: GitSha
    version: str
    spec_digest: str
    tree: GitSha
    prs: list[_LockedPR] = []
    patches: list[_LockedPatch] = []


class _LockedImage(_Open):
    image_id: ImageDigest


class _LockedBuild(_Open):
    source: _LockedSource | None = None
    image: _LockedImage | None = None


class _LockFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    schema_: int = Field(alias="schema")
    builds: dict[str, _LockedBuild]


def schema_problems(path: Path) -> list[str]:
    """What is wrong with the shape of the lock at ``path`` (empty when it validates).

    The loader's checks come first (UTF-8, no aliases, the schema every command reads, with
    file and line); then the stricter shape a lock sparkbuild wrote always has."""
    try:
        lockfile.load(path)
        data, _ = yamlfile.parse_yaml(path.read_bytes())
    except (LockError, BadYAMLError) as exc:
        return [exc.message if isinstance(exc, LockError) else f"{path}: {exc.problem}"]
    if not isinstance(data, dict):
        return [f"{path.name}: not a mapping with `schema:` and `builds:`"]
    if "schema" not in data:
        return [f"{path.name}: no `schema:` field (sparkbuild writes `schema: {SCHEMA}`)"]
    try:
        _LockFile.model_validate(data)
    except ValidationError as exc:
        return [
            f"{path.name}: `{'.'.join(str(p) for p in error['loc'])}`: {error['msg']}"
            for error in exc.errors()
        ]
    return []


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


def mirror_has(mirror: Mirror, entry: dict[str, Any]) -> bool:
    """Whether the mirror holds everything the locked entry pins (so it can be proven offline)."""
    if not (mirror.path / "HEAD").exists():
        return False
    wanted = [entry.get("commit")] + [p.get("head") for p in entry.get("prs") or []]
    return all(mirror.has_commit(str(sha)) for sha in wanted if sha)


__all__ = ["check_ref", "check_tree", "mirror_has", "schema_problems"]
