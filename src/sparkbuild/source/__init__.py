"""The source stage: a build's upstream commit plus its PRs and patches, as a git tree.

For each item, in spec order (PRs, then patches), exactly one status:

- ``applied``: it changed the tree;
- ``upstream``: its change is already there (PR head contained in the base, a reverse apply
  succeeds, or applying changes nothing): the rebase-helper rule, not an error;
- ``out-of-range``: its ``when`` excludes this build's version;
- ``conflict``: it does not apply exactly; the failing files and hunks are listed;
- ``missing``: the patch file or the PR ref does not exist;
- ``invalid``: the patch file is not a diff (an HTML page, empty, truncated, binary junk).

A PR's change is its own commits, from where it left the base branch to its head, never the
unrelated commits between the build's tag and the PR's base.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from sparkbuild import console, git, lockproof, scope
from sparkbuild import lock as lockfile
from sparkbuild.errors import LockError, SparkbuildError
from sparkbuild.mirror import Mirror, RemoteRefs, looks_like_sha
from sparkbuild.patching import ScratchIndex
from sparkbuild.settings import Settings
from sparkbuild.spec import PR, Build, Patch, file_sha256
from sparkbuild.validate import redact_url, strip_userinfo

Status = Literal["applied", "upstream", "out-of-range", "conflict", "missing", "invalid"]
FAILING: frozenset[str] = frozenset({"conflict", "missing", "invalid"})


@dataclass(frozen=True)
class ItemResult:
    kind: Literal["pr", "patch"]
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
    # patches
    file: str | None = None
    sha256: str | None = None
    # the diff itself, kept for conflict hand-off; not serialised
    diff: bytes = field(default=b"", repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
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
        archive = git.run(
            ["archive", "--format=tar", self.tree, "--", *selected], git_dir=self.mirror
        ).stdout
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="tar")

    def to_json(self) -> dict[str, Any]:
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


@dataclass
class _Pins:
    """What the lock pins for a ``--locked`` run (empty when resolving anew)."""

    commit: str | None = None
    pr_heads: dict[int, str] = field(default_factory=dict)
    pr_diffs: dict[int, str] = field(default_factory=dict)
    tree: str | None = None

    @classmethod
    def from_lock(cls, entry: dict[str, Any]) -> _Pins:
        prs = entry.get("prs", [])
        return cls(
            commit=entry.get("commit"),
            tree=entry.get("tree"),
            pr_heads={p["number"]: p["head"] for p in prs if p.get("head")},
            pr_diffs={p["number"]: p["diff_sha256"] for p in prs if p.get("diff_sha256")},
        )


def distinct_prefixes(a: str, b: str, shortest: int = 12) -> tuple[str, str]:
    """Short forms of two hashes that still differ (a lock cut short shares a prefix)."""
    length = shortest
    while length < max(len(a), len(b)) and a[:length] == b[:length]:
        length += 8
    return a[:length], b[:length]


# -- resolving -------------------------------------------------------------------------


def _fetch_for(mirror: Mirror, build: Build, prs: list[PR], pins: _Pins) -> RemoteRefs:
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
    return remote


def _resolve_base(mirror: Mirror, build: Build, remote: RemoteRefs, pins: _Pins) -> str:
    if pins.commit:
        if not mirror.has_commit(pins.commit):
            raise LockError(
                f"{build.name}: locked commit {pins.commit} is not in {redact_url(build.repo)}",
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
        raise SparkbuildError(
            f"{build.name}: ref '{build.ref}' not found at {redact_url(build.repo)}",
            f"check `ref:` in {build.spec_file.name}; "
            f"`git ls-remote {redact_url(build.repo)}` lists refs",
        )
    return git.text(
        ["rev-parse", "--verify", "--end-of-options", f"{sha}^{{commit}}"], git_dir=mirror.path
    )


def _fork_point(mirror: Mirror, head: str, base_branch: str) -> str:
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


def _squash_merge_of(mirror: Mirror, number: int, base: str) -> str | None:
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


def _is_ancestor(mirror: Mirror, commit: str, of: str) -> bool:
    result = git.run(
        ["merge-base", "--is-ancestor", "--end-of-options", commit, of],
        git_dir=mirror.path,
        check=False,
    )
    return result.returncode == 0


# -- applying ---------------------------------------------------------------------------


class _Applier:
    """Applies items in order onto a scratch index, committing after each applied one."""

    def __init__(self, mirror: Mirror, build: Build, base_commit: str) -> None:
        self.mirror = mirror
        self.build = build
        self.index = ScratchIndex(mirror.path, base_commit)
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


def _settle_pr(applier: _Applier, pr: PR, remote: RemoteRefs, pins: _Pins) -> ItemResult:
    build, mirror = applier.build, applier.mirror
    item = ItemResult(
        kind="pr", id=pr.id, status="missing", detail="", when=pr.when, number=pr.number
    )
    if not build.in_range(pr.when):
        return replace(
            item, status="out-of-range", detail=f"when '{pr.when}' excludes {build.version}"
        )
    head = remote.pr_head(pr.number)
    if head is None:
        return replace(item, detail=f"no refs/pull/{pr.number}/head at {redact_url(build.repo)}")
    locked_head = pins.pr_heads.get(pr.number)
    if locked_head and locked_head != head:
        raise LockError(
            f"{build.name}: PR #{pr.number} head moved since it was locked "
            "(locked {}, now {})".format(*distinct_prefixes(locked_head, head)),
            f"review the new commits, then `sparkbuild lock {build.name}` to pin them",
        )
    if _is_ancestor(mirror, head, applier.commit):
        return replace(
            item, status="upstream", head=head, detail=f"merged: head {head[:12]} is in the base"
        )
    merged_as = _squash_merge_of(mirror, pr.number, applier.commit)
    if merged_as:
        return replace(
            item, status="upstream", head=head, detail=f"squash-merged upstream as {merged_as}"
        )
    fork = _fork_point(mirror, head, build.base_branch)
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
    return replace(
        item,
        status=status,
        detail=detail,
        files=files,
        head=head,
        commits=commits,
        diff_sha256=digest,
        diff=diff,
    )


def _settle_patch(applier: _Applier, patch: Patch) -> ItemResult:
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
    if not build.in_range(patch.when):
        return replace(
            item, status="out-of-range", detail=f"when '{patch.when}' excludes {build.version}"
        )
    if patch.path.is_dir():
        return replace(item, status="invalid", detail=f"{patch.file} is a directory, not a diff")
    if not patch.path.is_file():
        return replace(item, detail=f"no such file: {patch.path}")
    diff = patch.path.read_bytes()
    problem = applier.index.diff_problem(diff)
    if problem:
        return replace(item, status="invalid", detail=f"{patch.file}: {problem}")
    digest = hashlib.sha256(diff).hexdigest()
    if patch.sha256 and patch.sha256 != digest:
        raise SparkbuildError(
            f"{patch.file}: sha256 {digest} does not match the pin {patch.sha256} in "
            f"{build.spec_file.name}",
            "if the patch was changed on purpose, update `sha256:` in the spec",
        )
    status, detail, files = applier.settle(diff, f"patch {patch.file}")
    return replace(item, status=status, detail=detail, files=files, diff=diff)


def _note_overlay_scope(build: Build, item: ItemResult) -> ItemResult:
    """In overlay mode, say which of an item's tests and docs the image leaves out."""
    note = scope.left_out_note(build.package_dir, item.files)
    if build.image.mode != "overlay" or item.status != "applied" or note is None:
        return item
    return replace(item, detail=f"{item.detail}; {note}")


def _changed(mirror: Mirror, base_commit: str, tree: str) -> tuple[ChangedFile, ...]:
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


def _locked_heads(build: Build, settings: Settings) -> dict[int, str]:
    """PR heads the lock pins for ``build``, to mention when an unlocked run sees others.

    Only a note: an unlocked run must work with a damaged lock (that is how it is redone)."""
    try:
        entry = lockfile.build_entry(lockfile.load(settings.lock_file), build.name)
    except LockError as exc:
        console.warn(f"ignoring {settings.lock_file.name} for this unlocked run: {exc.message}")
        return {}
    source = entry.get("source") if entry else None
    return _Pins.from_lock(source).pr_heads if isinstance(source, dict) else {}


def _note_moved_head(item: ItemResult, noted: dict[int, str], build: Build) -> ItemResult:
    locked = noted.get(item.number or 0)
    if item.kind != "pr" or not item.head or not locked or locked == item.head:
        return item
    then, now = distinct_prefixes(locked, item.head)
    note = (
        f"; images.lock pins head {then}, now {now} "
        f"(`sparkbuild lock {build.name}` to pin the new head)"
    )
    return replace(item, detail=item.detail + note)


def prepare_source(
    build: Build, settings: Settings, *, locked: bool = False, offline: bool = False
) -> PreparedSource:
    """Resolve, fetch and patch one build. With ``locked``, use only what the lock pins and
    prove it: the pinned commit is what ``ref`` resolves to and the patched tree is the
    locked one. ``offline`` (with ``locked``) uses the mirror as it is, fetching nothing."""
    pins = _Pins()
    if locked:
        entry = require_locked_source(build, settings)
        pins = _Pins.from_lock(entry)
    noted = {} if locked else _locked_heads(build, settings)
    mirror = Mirror(settings.cache_dir, build.repo)
    in_range = [pr for pr in build.prs if build.in_range(pr.when)]
    with mirror.locked():
        if offline and locked:
            remote = mirror.local_refs()
        else:
            remote = _fetch_for(mirror, build, in_range, pins)
        base_commit = _resolve_base(mirror, build, remote, pins)
        if locked:
            lockproof.check_ref(mirror, build, base_commit)
    applier = _Applier(mirror, build, base_commit)
    try:
        with console.status(
            f"{build.name}: applying {len(build.prs)} PR(s), {len(build.patches)} patch(es)"
        ):
            items = [_settle_pr(applier, pr, remote, pins) for pr in build.prs]
            items += [_settle_patch(applier, patch) for patch in build.patches]
    finally:
        applier.close()
    if locked and not any(item.status in FAILING for item in items):
        lockproof.check_tree(build, pins.tree, applier.tree)
    items = [_note_moved_head(item, noted, build) for item in items]
    items = [_note_overlay_scope(build, item) for item in items]
    return PreparedSource(
        build=build,
        base_commit=base_commit,
        tree=applier.tree,
        head_commit=applier.commit,
        items=tuple(items),
        changed=_changed(mirror, base_commit, applier.tree),
        mirror=mirror.path,
        conflict_commit=applier.conflict_commit,
    )


# -- the lock ---------------------------------------------------------------------------


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


# -- checkouts --------------------------------------------------------------------------

_MARKER = "sparkbuild-checkout"


def local_changes(out: Path) -> list[str]:
    """Edited, staged, untracked and ignored paths of a checkout: what a re-checkout loses."""
    result = git.run(
        ["status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignored"],
        cwd=out,
        check=False,
    )
    if result.returncode != 0:
        return []
    records = result.stdout.decode(errors="replace").split("\0")
    changes: list[str] = []
    skip = False
    for record in records:
        if skip or len(record) < 4:  # a rename's second path, or the trailing empty field
            skip = False
            continue
        code, path = record[:2], record[3:]
        skip = "R" in code or "C" in code
        if path.split("/", 1)[0] != ".sparkbuild":  # kept by the re-checkout
            changes.append(f"{code.strip() or '?'} {path}")
    return changes


def checkout(prepared: PreparedSource, out: Path, *, force: bool = False) -> Path:
    """A git checkout of the patched tree at ``out``, one commit per applied item.

    On conflict the checkout stops at the last good commit and the conflicting diff is
    saved beside it; the caller prints the command to try it by hand. An existing checkout
    with local edits or untracked files is left alone unless ``force``.
    """
    out = out.resolve()
    if out.exists() and any(out.iterdir()) and not (out / ".git" / _MARKER).exists():
        raise SparkbuildError(
            f"{out} exists and is not a sparkbuild checkout", "pass an empty or new --out DIR"
        )
    lost = local_changes(out) if (out / ".git" / _MARKER).exists() and not force else []
    if lost:
        shown = "\n  ".join(lost[:20]) + (
            f"\n  ... and {len(lost) - 20} more" if len(lost) > 20 else ""
        )
        raise SparkbuildError(
            f"{out} has local changes that a new checkout would discard:\n  {shown}",
            f"save them (e.g. `cd {out} && git diff > my.patch`), or re-run with --force "
            "to discard them, or pass another --out DIR",
        )
    if not (out / ".git").exists():
        out.mkdir(parents=True, exist_ok=True)
        git.run(["init", "--quiet", "--", str(out)])
        (out / ".git" / _MARKER).write_text(prepared.build.name + "\n")
    alternates = out / ".git" / "objects" / "info" / "alternates"
    alternates.write_text(str(prepared.mirror / "objects") + "\n")
    target = prepared.conflict_commit or prepared.head_commit
    branch = f"sparkbuild/{prepared.build.name}"
    # checkout.workers=0: one checkout worker per core (git's parallel checkout).
    git.run(
        ["-c", "checkout.workers=0", "checkout", "--quiet", "--force", "-B", branch, target, "--"],
        cwd=out,
    )
    git.run(["clean", "--quiet", "-fdx", "-e", ".sparkbuild"], cwd=out)
    _save_conflicts(prepared, out)
    return out


def _save_conflicts(prepared: PreparedSource, out: Path) -> None:
    folder = out / ".git" / "sparkbuild"
    shutil.rmtree(folder, ignore_errors=True)
    for item in prepared.items:
        if item.status == "conflict":
            folder.mkdir(parents=True, exist_ok=True)
            (folder / conflict_patch_name(item)).write_bytes(item.diff)


def conflict_patch_name(item: ItemResult) -> str:
    stem = f"pr-{item.number}" if item.kind == "pr" else Path(item.file or "patch").stem
    return f"{stem}.patch"


def default_checkout_dir(settings: Settings, build: Build) -> Path:
    return settings.cache_dir / "trees" / build.name


__all__ = [
    "ChangedFile",
    "ItemResult",
    "PreparedSource",
    "checkout",
    "prepare_source",
    "record",
    "require_locked_source",
    "staleness",
]
