"""What preflight's caches are trusted with, and the checks that earn it (docs/preflight.md,
"What the caches trust").

Preflight runs the ``bin/python`` of a cached venv, and reads kernel stand-ins, exported
trees and baselines from the cache as inputs to its verdicts. Whoever can write there could
run code as the user, or choose the verdict. So a cache is trusted only as far as it proves
itself:

- **Directories.** A cache directory is made 0700 and refused (``UntrustedCacheError``)
  when it is not the user's own or is writable by group or others, or a directory above it
  is neither the user's nor root's, or is writable by others without the sticky bit (as
  ``/tmp`` is).
- **Items.** A venv, a stand-in or a tree carries a manifest of what it was made from,
  written last with a digest of itself; an item whose manifest is missing, cut short, for
  something else, or whose files do not match it, is made again with a note
  (:func:`discard`), never used.
- **Symlinks.** Nothing run or read resolves out of its item; a venv's interpreter is the
  one exception, and must be the interpreter its manifest names.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from sparkbuild import console, fileio
from sparkbuild.errors import UntrustedCacheError

_HINT = (
    "remove it (or make it yours: chown, chmod go-w) and run again, or pass --cache-dir a "
    "directory of your own"
)
PYCACHE = "__pycache__"  # bytecode Python writes beside what it imports: see trust_pycache


def _mode_problem(info: os.stat_result, *, own: bool) -> str | None:
    """Why a file or directory with ``info`` is not trusted: not the user's (``own``; else
    neither the user's nor root's), or writable by group or others (above the cache, a
    sticky directory such as /tmp is fine: others cannot replace what is ours in it)."""
    uid = os.geteuid()
    if info.st_uid != uid and (own or info.st_uid != 0):
        return f"is owned by uid {info.st_uid}, not by you (uid {uid})"
    writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    sticky = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
    if writable and (own or not sticky):
        return f"is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def path_problem(path: Path, *, own: bool = True) -> str | None:
    """Why ``path`` (not followed if a symlink) is not trusted, or None."""
    try:
        return _mode_problem(os.lstat(path), own=own)
    except OSError as exc:
        return f"cannot be read ({fileio.reason(exc)})"


def chain_problem(path: Path, *, own: bool = True) -> str | None:
    """Why ``path``'s real location is not trusted: it (``own``: the user's own), or a
    directory above it (the user's or root's, and not writable by others)."""
    real = path.resolve()
    for level, here in enumerate((real, *real.parents)):
        why = path_problem(here, own=own and level == 0)
        if why is not None:
            return why if here == path else f"({here}) {why}"
    return None


def check_directory(path: Path, what: str) -> Path:
    """``path``'s real directory, when it and every directory above it are trusted;
    UntrustedCacheError naming the first that is not."""
    why = chain_problem(path)
    if why is not None:
        raise UntrustedCacheError(f"{what} {path} {why}: it is not used", _HINT)
    return path.resolve()


def private_dir(path: Path, what: str) -> Path:
    """The cache directory ``path``, made 0700 (with its missing parents) where it is not
    there, and checked (:func:`check_directory`): its real path."""
    missing = []
    here = path
    while not os.path.lexists(here) and here != here.parent:
        missing.append(here)
        here = here.parent
    if missing:  # nothing is made in a directory others could write
        why = chain_problem(here, own=False)
        if why is not None:
            raise UntrustedCacheError(f"{what} {path}: {here} {why}: it is not used", _HINT)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile: checked below
            directory.mkdir(mode=0o700)
    return check_directory(path, what)


def inside(path: Path, root: Path) -> bool:
    """Whether ``path`` resolves to ``root`` or somewhere under it."""
    return path.resolve().is_relative_to(root.resolve())


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# --- manifests -----------------------------------------------------------------------------


def _digest(body: Mapping[str, object]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def write_manifest(path: Path, body: Mapping[str, object]) -> None:
    """``body`` with a digest of itself, written whole (a manifest is written last: an
    item without one was never finished)."""
    fileio.write_atomic(path, json.dumps({**body, "sha256": _digest(body)}, indent=1) + "\n")


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest at ``path``, or None when it is not a trusted file (a symlink, another
    user's, writable by others), not JSON, or not the body its digest was made from."""
    if not path.is_file() or path.is_symlink() or path_problem(path) is not None:
        return None
    try:
        data = json.loads(fileio.read_text(path, limit=64 * fileio.MIB))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    digest = data.pop("sha256", None)
    return data if digest == _digest(data) else None


# --- the files of an item ------------------------------------------------------------------


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under ``root`` (relative path with ``/``, lstat), symlinks not followed.
    Strings, not Paths: a tree of thousands of files is walked on every check."""
    base = str(root)
    pending = [""]
    while pending:
        folder = pending.pop()
        with os.scandir(os.path.join(base, folder) if folder else base) as entries:
            for entry in entries:
                relative = f"{folder}/{entry.name}" if folder else entry.name
                info = entry.stat(follow_symlinks=False)
                yield relative, info
                if stat.S_ISDIR(info.st_mode):
                    pending.append(relative)


def file_hashes(root: Path, *, skip: frozenset[str] = frozenset()) -> dict[str, str]:
    """sha256 of every regular file under ``root`` (``skip``: relative paths left out), for
    a manifest. Bytecode caches are left out: see :func:`trust_pycache`."""
    return {
        relative: sha256_of(root / relative)
        for relative, info in _walk(root)
        if stat.S_ISREG(info.st_mode) and relative not in skip and PYCACHE not in relative
    }


def _same_sha256(path: str, expected: str) -> bool:
    return not os.path.islink(path) and sha256_of(Path(path)) == expected


#: Items whose files passed in this process, by root and manifest: the stat of each entry
#: then (size, times, inode). A run that checks one item for several builds hashes it once;
#: anything written to it since changes a ctime, which no one can set back.
_PASSED: dict[tuple[str, str], list[tuple[str, int, int, int, int, int]]] = {}


def _signature(root: Path) -> list[tuple[str, int, int, int, int, int]]:
    return [
        (relative, i.st_mode, i.st_size, i.st_mtime_ns, i.st_ctime_ns, i.st_ino)
        for relative, i in _walk(root)
    ]


def files_problem(
    root: Path,
    expected: Mapping[str, str],
    *,
    skip: frozenset[str] = frozenset(),
    same: Callable[[str, str], bool] = _same_sha256,
    within: Path | None = None,
) -> str | None:
    """Why the files under ``root`` are not exactly ``expected`` (relative path -> what
    ``same`` compares each file with: its sha256 by default), or None. A file missing,
    changed or added, a special file, a symlink (one that ``expected`` names must stay
    inside ``within``, by default ``root``), a directory or file others could write: each
    is a problem. Every file is read: an item is its files."""
    key = (str(root.resolve()), _digest({"expected": dict(expected), "skip": sorted(skip)}))
    signature = _signature(root)
    if _PASSED.get(key) == signature:
        return None
    seen = set()
    for relative, info in _walk(root):
        if relative in skip:
            continue
        why = _entry_problem(root, relative, info, expected, same, within or root)
        if why is not None:
            return f"{relative} {why}"
        seen.add(relative)
    missing = sorted(set(expected) - seen)
    if missing:
        return f"{missing[0]} is missing"
    _PASSED[key] = signature
    return None


def _entry_problem(
    root: Path,
    relative: str,
    info: os.stat_result,
    expected: Mapping[str, str],
    same: Callable[[str, str], bool],
    within: Path,
) -> str | None:
    link = stat.S_ISLNK(info.st_mode)
    why = None if link else _mode_problem(info, own=True)  # a link's own mode means nothing
    if why is not None or stat.S_ISDIR(info.st_mode):
        return why
    if PYCACHE in relative.split("/"):
        return trust_pycache(relative, info)
    if relative not in expected:
        return "is not one of the files it was made with"
    path = os.path.join(root, relative)
    if link and not inside(Path(path), within):
        return f"is a symlink out of {within}"
    if not link and not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if not same(path, expected[relative]):
        return "is not the file it was made with (its hash differs)"
    return None


def tree_problem(root: Path) -> str | None:
    """Why the directory ``root`` and everything under it is not trusted as a whole: an
    entry another user owns, one group or others can write, a symlink or a special file
    (for items, such as a git mirror, whose integrity is their content's own hashes and
    that no manifest lists)."""
    why = path_problem(root)
    if why is None and not root.is_dir():
        why = "is not a directory"
    if why is not None:
        return why
    for relative, info in _walk(root):
        if stat.S_ISLNK(info.st_mode):
            return f"{relative} is a symlink"
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
            return f"{relative} is not a regular file"
        why = _mode_problem(info, own=True)
        if why is not None:
            return f"{relative} {why}"
    return None


def seal_modes(root: Path) -> None:
    """Nothing under ``root`` (just made) writable by group or others, whatever the umask
    it was made under: :func:`files_problem` would refuse it."""
    for directory, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(directory, name)
            info = os.lstat(path)
            if not stat.S_ISLNK(info.st_mode) and info.st_mode & 0o022:
                path.chmod(stat.S_IMODE(info.st_mode) & ~0o022)
    root.chmod(stat.S_IMODE(root.stat().st_mode) & ~0o022)


def trust_pycache(relative: str, info: os.stat_result) -> str | None:
    """Python writes the bytecode of what it imports beside the source (``__pycache__``);
    it is trusted as far as the directory is (the user's own, written by no one else):
    Python itself checks it against its source's size and time. Only regular ``.pyc``
    files may be there."""
    if not stat.S_ISREG(info.st_mode) or not relative.endswith(".pyc"):
        return "is not Python bytecode"
    return None


def discard(path: Path, what: str, why: str, *, by: str = "preflight") -> None:
    """An item that failed its check: said (``by``: the stage), removed, to be made again.
    One that cannot be removed (another user's) is refused, never used."""
    console.err.print(f"{by}: {what} {path} is not used: {why}; making it again", markup=False)
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        raise UntrustedCacheError(f"{what} {path} {why}, and cannot be removed", _HINT)


__all__ = [
    "chain_problem",
    "check_directory",
    "discard",
    "file_hashes",
    "files_problem",
    "inside",
    "path_problem",
    "private_dir",
    "read_manifest",
    "seal_modes",
    "sha256_of",
    "tree_problem",
    "write_manifest",
]
