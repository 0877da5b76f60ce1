"""Applying a build's PRs and patches in spec order, each settling on exactly one status
(source steps, after them: :mod:`sparkbuild.source.steps`)."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from sparkbuild import fileio, git
from sparkbuild.errors import LockError, PatchChecksumError
from sparkbuild.redact import redact
from sparkbuild.source import scope
from sparkbuild.source.items import ChangedFile, ItemResult, Status, distinct_prefixes
from sparkbuild.source.mirror import Mirror, RemoteRefs
from sparkbuild.source.patching import ScratchIndex
from sparkbuild.source.pins import Pins
from sparkbuild.source.resolve import is_ancestor, pr_range_start, squash_merge_of
from sparkbuild.spec import PR, Build, Patch, file_sha256


class Applier:
    """Applies items in order onto a scratch index, committing after each applied one."""

    def __init__(self, mirror: Mirror, build: Build, base_commit: str) -> None:
        self.mirror = mirror
        self.build = build
        self.index = ScratchIndex(mirror.path, base_commit, offline=mirror.offline)
        self.base_commit = base_commit
        self.commit = base_commit
        self.tree = self.index.write_tree()
        self.conflict_commit: str | None = None
        self._date = git.text(
            ["log", "-1", "--format=%cI", "--end-of-options", base_commit], git_dir=mirror.path
        )

    def close(self) -> None:
        self.index.__exit__(None, None, None)

    def _commit(self, message: str) -> None:
        env = {"GIT_AUTHOR_DATE": self._date, "GIT_COMMITTER_DATE": self._date}
        self.commit = git.text(
            ["commit-tree", self.tree, "-p", self.commit, "-m", message],
            git_dir=self.mirror.path,
            env=env,
        )

    def record(self, label: str) -> None:
        """Take what was written into the index as the next tree, committed as ``label``."""
        self.tree = self.index.write_tree()
        self._commit(f"sparkbuild: {label}")

    def settle(self, diff: bytes, label: str) -> tuple[Status, str, tuple[str, ...]]:
        """Apply ``diff``; return its status, a one-line detail and the files it touches."""
        files = tuple(self.index.files(diff))
        if not diff.strip() or not files:
            return "upstream", "nothing to apply: the change is empty", files
        if self.index.apply(diff).ok:  # all or nothing: a failed apply leaves the index as is
            before = self.tree
            self.tree = self.index.write_tree()
            if self.tree == before:
                return "upstream", "applying it changes nothing", files
            self._commit(f"sparkbuild: {label}")
            return "applied", f"changed {len(files)} file(s)", files
        if self.index.reverse_applies(diff).ok:
            return "upstream", "its change is already in the tree (reverse apply succeeds)", files
        if self.conflict_commit is None:
            self.conflict_commit = self.commit
        hunks = self.index.failed_hunks(diff)
        listed = "; ".join(str(h) for h in hunks) or self.index.applies(diff).message
        return "conflict", f"does not apply: {listed}", files


def settle_pr(applier: Applier, pr: PR, remote: RemoteRefs, pins: Pins) -> ItemResult:
    build, mirror = applier.build, applier.mirror
    item = ItemResult(
        kind="pr", id=pr.id, status="missing", detail="", when=pr.when, number=pr.number
    )
    if (skipped := out_of_range(build, item)) is not None:
        return skipped
    head = remote.pr_head(pr.number)
    if head is None:
        return replace(item, detail=f"no refs/pull/{pr.number}/head at {redact(build.repo)}")
    locked_head = pins.pr_heads.get(pr.number)
    if locked_head and locked_head != head:
        raise LockError(
            f"{build.name}: PR #{pr.number} head moved since it was locked "
            "(locked {}, now {})".format(*distinct_prefixes(locked_head, head)),
            f"review the new commits, then `sparkbuild lock {build.name}` to pin them",
        )
    if is_ancestor(mirror, head, applier.commit):
        return replace(
            item, status="upstream", head=head, detail=f"merged: head {head[:12]} is in the base"
        )
    merged_as = squash_merge_of(mirror, pr.number, applier.commit)
    if merged_as:
        return replace(
            item, status="upstream", head=head, detail=f"squash-merged upstream as {merged_as}"
        )
    fork, on_branch = pr_range_start(mirror, head, build.base_branch, applier.base_commit)
    _complete_both(mirror, fork, head)
    commits = tuple(
        git.text(["rev-list", "--reverse", f"{fork}..{head}"], git_dir=mirror.path).split()
    )
    diff = git.run(
        ["diff", "--binary", "--full-index", "--end-of-options", fork, head], git_dir=mirror.path
    ).stdout
    digest = hashlib.sha256(diff).hexdigest()
    locked_digest = pins.pr_diffs.get(pr.number)
    if locked_digest and locked_digest != digest:
        raise LockError(
            f"{build.name}: PR #{pr.number}'s change differs from the locked one "
            "(diff sha256 {} vs {})".format(*distinct_prefixes(digest, locked_digest)),
            f"`sparkbuild lock {build.name}` to pin it again",
        )
    status, detail, files = applier.settle(diff, f"PR #{pr.number} ({head[:12]})")
    if status == "applied" and on_branch:
        detail += (
            f"; its head is on {build.base_branch} after the build's commit, so its "
            f"{len(commits)} commit(s) since {fork[:12]} were applied"
        )
    return replace(
        item,
        status=status,
        detail=detail,
        files=files,
        head=head,
        commits=commits,
        diff_sha256=digest,
        diff=diff,
        before_commit=applier.commit if status == "conflict" else None,
    )


def out_of_range(build: Build, item: ItemResult) -> ItemResult | None:
    """``item`` settled as out-of-range when its `when` excludes the build's version."""
    if build.in_range(item.when):
        return None
    return replace(
        item, status="out-of-range", detail=f"when '{item.when}' excludes {build.version}"
    )


def _complete_both(mirror: Mirror, old: str, new: str) -> None:
    """Both sides of the files that differ between two commits, fetched before the diff."""
    names = git.run(
        ["diff-tree", "-r", "--no-renames", "--name-only", "-z", "--end-of-options", old, new],
        git_dir=mirror.path,
    ).stdout.decode(errors="replace")
    paths = [name for name in names.split("\0") if name]
    mirror.complete(old, paths)
    mirror.complete(new, paths)


def settle_patch(applier: Applier, patch: Patch) -> ItemResult:
    build = applier.build
    item = ItemResult(
        kind="patch",
        id=patch.id,
        status="missing",
        detail="",
        when=patch.when,
        file=patch.file,
        sha256=file_sha256(patch.path),
    )
    if (skipped := out_of_range(build, item)) is not None:
        return skipped
    try:
        diff = fileio.read_bytes(patch.path)  # a FIFO, a device or a huge file is refused
    except FileNotFoundError:
        return replace(item, detail=f"no such file: {patch.path}")
    except OSError as exc:  # a directory, a FIFO, a symlink loop, unreadable
        return replace(item, status="invalid", detail=f"{patch.file}: {fileio.reason(exc)}")
    problem = applier.index.diff_problem(diff)
    if problem:
        return replace(item, status="invalid", detail=f"{patch.file}: {problem}")
    digest = hashlib.sha256(diff).hexdigest()
    if patch.sha256 and patch.sha256 != digest:
        raise PatchChecksumError(
            f"{patch.file}: sha256 {digest} does not match the pin {patch.sha256} in "
            f"{build.spec_file.name}",
            "if the patch was changed on purpose, update `sha256:` in the spec",
        )
    status, detail, files = applier.settle(diff, f"patch {patch.file}")
    before = applier.commit if status == "conflict" else None
    return replace(item, status=status, detail=detail, files=files, diff=diff, before_commit=before)


def note_overlay_scope(build: Build, item: ItemResult) -> ItemResult:
    """In overlay mode, say which of an item's tests and docs the image leaves out."""
    note = scope.left_out_note(build.package_dir, item.files)
    if build.image.mode != "overlay" or item.status != "applied" or note is None:
        return item
    return replace(item, detail=f"{item.detail}; {note}")


def changed_files(mirror: Mirror, base_commit: str, tree: str) -> tuple[ChangedFile, ...]:
    raw = git.text(
        [
            *("diff-tree", "-r", "--no-renames", "--name-status", "-z", "--end-of-options"),
            f"{base_commit}^{{tree}}",
            tree,
        ],
        git_dir=mirror.path,
    )
    fields = [f for f in raw.split("\0") if f]
    return tuple(
        ChangedFile(path=fields[i + 1], status=fields[i][0])  # type: ignore[arg-type]
        for i in range(0, len(fields) - 1, 2)
    )


def note_moved_head(item: ItemResult, noted: dict[int, str], build: Build) -> ItemResult:
    locked = noted.get(item.number or 0)
    if item.kind != "pr" or not item.head or not locked or locked == item.head:
        return item
    then, now = distinct_prefixes(locked, item.head)
    note = (
        f"; images.lock pins head {then}, now {now} "
        f"(`sparkbuild lock {build.name}` to pin the new head)"
    )
    return replace(item, detail=item.detail + note)
