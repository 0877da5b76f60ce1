"""Proving that images.lock tells the truth about a build's source, offline.

Two checks, used by ``--locked`` runs and by ``sparkbuild lock --check`` (which first checks
the file's shape with :func:`sparkbuild.lockfile.check`):

- :func:`check_ref`: the pinned ``commit:`` is what the spec's ``ref`` resolves to in the
  local mirror (a tag exactly; a branch contains it, since branches move on after locking);
- :func:`check_tree`: the patched tree sparkbuild just derived is the locked ``tree:``.

A lock edited by hand (another tag's commit, a tree of zeros) fails one of them with the
field named, instead of producing a different tree from the old sources.
"""

from __future__ import annotations

from sparkbuild import git
from sparkbuild.errors import LockError
from sparkbuild.lockfile import SourceSection
from sparkbuild.source.mirror import Mirror, looks_like_sha
from sparkbuild.spec import Build


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


def mirror_has(mirror: Mirror, locked: SourceSection) -> bool:
    """Whether the mirror holds everything the locked entry pins (so it can be proven offline)."""
    if not (mirror.path / "HEAD").exists():
        return False
    wanted = [locked.commit, *(pr.head for pr in locked.prs)]
    return all(mirror.has_commit(sha) for sha in wanted if sha)


__all__ = ["check_ref", "check_tree", "mirror_has"]
