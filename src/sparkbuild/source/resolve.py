"""Resolving a build's upstream: fetch the refs it needs into the mirror, pin the base
commit, and find where each PR left the base branch."""

from __future__ import annotations

from sparkbuild import git
from sparkbuild.errors import LockError, UnknownRefError
from sparkbuild.redact import redact
from sparkbuild.source.mirror import Mirror, RemoteRefs, looks_like_sha
from sparkbuild.source.pins import Pins
from sparkbuild.spec import PR, Build


def fetch_for(mirror: Mirror, build: Build, prs: list[PR], pins: Pins) -> RemoteRefs:
    """Bring the base branch, the ref and the in-range PR heads into the mirror."""
    patterns = [f"refs/heads/{build.base_branch}"] + [f"refs/pull/{pr.number}/head" for pr in prs]
    if not looks_like_sha(build.ref):
        patterns += [
            f"refs/tags/{build.ref}",
            f"refs/tags/{build.ref}^{{}}",
            f"refs/heads/{build.ref}",
        ]
    remote = mirror.ls_remote(patterns)
    refspecs = [f"+refs/heads/{build.base_branch}:refs/remotes/origin/{build.base_branch}"]
    if f"refs/heads/{build.ref}" in remote.refs:
        refspecs.append(f"+refs/heads/{build.ref}:refs/remotes/origin/{build.ref}")
    refspecs += [
        f"+refs/pull/{pr.number}/head:refs/pull/{pr.number}/head"
        for pr in prs
        if remote.pr_head(pr.number)
    ]
    wanted = [sha for sha in (pins.commit, *pins.pr_heads.values()) if sha]
    if any(not mirror.has_commit(sha) for sha in wanted) or not pins.commit:
        mirror.fetch(refspecs)
    elif not _has_ref(mirror, build):
        # A partial mirror finds a pinned commit through its promisor remote (`cat-file -e`
        # fetches it lazily), but not the tag or branch `--locked` proves it against.
        mirror.fetch(refspecs)
    return remote


def _has_ref(mirror: Mirror, build: Build) -> bool:
    if looks_like_sha(build.ref):
        return True
    names = (f"refs/tags/{build.ref}", f"refs/remotes/origin/{build.ref}")
    return any(mirror.rev_parse(name) for name in names)


def resolve_base(mirror: Mirror, build: Build, remote: RemoteRefs, pins: Pins) -> str:
    if pins.commit:
        if not mirror.has_commit(pins.commit):
            raise LockError(
                f"{build.name}: locked commit {pins.commit} is not in {redact(build.repo)}",
                "the upstream history was rewritten; re-resolve with `sparkbuild lock "
                f"{build.name}`",
            )
        return pins.commit
    sha = remote.resolve(build.ref)
    if sha is None and looks_like_sha(build.ref):
        if not mirror.has_commit(build.ref):
            mirror.fetch([build.ref])
        sha = mirror.rev_parse(build.ref)
    if sha is None or not mirror.has_commit(sha):
        raise UnknownRefError(
            f"{build.name}: ref '{build.ref}' not found at {redact(build.repo)}",
            f"check `ref:` in {build.spec_file.name}; "
            f"`git ls-remote {redact(build.repo)}` lists refs",
        )
    return git.text(
        ["rev-parse", "--verify", "--end-of-options", f"{sha}^{{commit}}"], git_dir=mirror.path
    )


def fork_point(mirror: Mirror, head: str, base_branch: str) -> str:
    """Where the PR left the base branch: the newest first-parent commit of the branch that
    the PR head contains. Works for open PRs and for PRs merged by merge commit."""
    branch = f"refs/remotes/origin/{base_branch}"
    outside = git.text(["rev-list", "--first-parent", branch, "--not", head], git_dir=mirror.path)
    if not outside:
        return git.text(["merge-base", "--end-of-options", head, branch], git_dir=mirror.path)
    oldest_outside = outside.splitlines()[-1]
    parent = git.run(
        ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{oldest_outside}^1"],
        git_dir=mirror.path,
        check=False,
    )
    if parent.returncode != 0:  # the branch and the PR share no history
        return git.text(["merge-base", "--end-of-options", head, branch], git_dir=mirror.path)
    return parent.stdout.decode().strip()


def pr_range_start(
    mirror: Mirror, head: str, base_branch: str, build_commit: str
) -> tuple[str, bool]:
    """Where the PR's own change starts for a build at ``build_commit``, and whether its head
    sits on the base branch's first-parent history (fast-forwarded or pushed onto it). Such a
    head has no fork of its own there: its range starts where it meets the build's commit,
    so a build older than the head gets the change instead of an empty diff."""
    fork = fork_point(mirror, head, base_branch)
    if fork != head:
        return fork, False
    meet = git.text(["merge-base", "--end-of-options", head, build_commit], git_dir=mirror.path)
    return meet, True


def squash_merge_of(mirror: Mirror, number: int, base: str) -> str | None:
    """GitHub titles a squash merge "... (#N)"; the newest such commit in the base that is
    not a revert means the PR is in, even where later commits changed the same lines."""
    log = git.text(
        [
            "log",
            "--format=%h %s",
            "--fixed-strings",
            f"--grep=(#{number})",
            "--end-of-options",
            base,
        ],
        git_dir=mirror.path,
    )
    for line in log.splitlines():
        short, _, subject = line.partition(" ")
        if f"(#{number})" in subject and not subject.startswith("Revert"):
            return f"{short} ({subject})"
    return None


def is_ancestor(mirror: Mirror, commit: str, of: str) -> bool:
    result = git.run(
        ["merge-base", "--is-ancestor", "--end-of-options", commit, of],
        git_dir=mirror.path,
        check=False,
    )
    return result.returncode == 0
