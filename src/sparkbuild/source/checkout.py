"""A git checkout of a prepared tree, for people: one commit per applied item, conflicts
saved beside it, local work never discarded without ``--force``."""

from __future__ import annotations

import shutil
from pathlib import Path

from sparkbuild import cachetrust, fileio, git
from sparkbuild.errors import CheckoutDirError, GitError
from sparkbuild.settings import Settings
from sparkbuild.source.items import ItemResult, PreparedSource
from sparkbuild.source.mirror import complete
from sparkbuild.spec import Build

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
    with local edits or untracked files is left alone unless ``force``. A disk that is full
    or read-only is a CheckoutDirError naming the directory.
    """
    if out.is_symlink():  # a checkout is written at the path named, never through a link
        raise CheckoutDirError(
            f"{out} is a symlink; a checkout is never written through one",
            "remove the link, or pass the directory it points to as --out",
        )
    try:
        return _checkout(prepared, fileio.resolve_parent(out), force=force)
    except OSError as exc:
        raise _unwritable(out, exc.strerror or str(exc)) from exc
    except GitError as exc:
        said = exc.stderr.lower()
        if not any(s in said for s in ("read-only file system", "no space left")):
            raise
        raise _unwritable(out, exc.stderr.splitlines()[-1]) from exc


def _unwritable(out: Path, why: str) -> CheckoutDirError:
    return CheckoutDirError(
        f"{out}: cannot write the checkout: {why}",
        "free space on that disk or make it writable, or pass another --out DIR",
    )


def _checkout(prepared: PreparedSource, out: Path, *, force: bool) -> Path:
    if out.exists() and any(out.iterdir()) and not (out / ".git" / _MARKER).exists():
        raise CheckoutDirError(
            f"{out} exists and is not a sparkbuild checkout", "pass an empty or new --out DIR"
        )
    lost = local_changes(out) if (out / ".git" / _MARKER).exists() and not force else []
    if lost:
        shown = "\n  ".join(lost[:20]) + (
            f"\n  ... and {len(lost) - 20} more" if len(lost) > 20 else ""
        )
        raise CheckoutDirError(
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
    complete(prepared.mirror, target)  # the checkout reads the mirror's objects
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
    for ref in git.text(["for-each-ref", "--format=%(refname)", BEFORE_REFS], cwd=out).split():
        git.run(["update-ref", "-d", ref], cwd=out)
    for item in prepared.items:
        if item.status == "conflict":
            folder.mkdir(parents=True, exist_ok=True)
            (folder / conflict_patch_name(item)).write_bytes(item.diff)
            if item.before_commit and item.before_commit != prepared.conflict_commit:
                git.run(["update-ref", before_branch(item, full=True), item.before_commit], cwd=out)


BEFORE_REFS = "refs/heads/sparkbuild-before/"


def before_branch(item: ItemResult, *, full: bool = False) -> str:
    """The branch of the tree a later conflict failed on: the items between the first
    conflict and it applied, the earlier conflicts left out."""
    name = f"sparkbuild-before/{Path(conflict_patch_name(item)).stem}"
    return f"refs/heads/{name}" if full else name


def conflict_patch_name(item: ItemResult) -> str:
    stem = f"pr-{item.number}" if item.kind == "pr" else Path(item.file or "patch").stem
    return f"{stem}.patch"


def default_checkout_dir(settings: Settings, build: Build) -> Path:
    """``trees/BUILD`` in the cache, a private directory (``cachetrust``) as every cache's."""
    return cachetrust.private_dir(settings.cache_dir / "trees", "the checkout cache") / build.name
