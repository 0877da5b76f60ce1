"""Reading and writing the files sparkbuild is handed: regular files only, of bounded size.

A path in a spec, a profile, ``--lock-file`` or ``bench compare`` can name anything: a FIFO
(reading it waits for a writer forever), a device (``/dev/zero`` never ends), a symlink loop,
a file of many gigabytes. Every such read goes through :func:`read_bytes`, which opens without
blocking, refuses what is not a regular file and stops at a size limit. Its errors are
``OSError`` with a readable ``strerror``, so each caller's "cannot read FILE: why" covers them.

Outputs (``--markdown``, ``--csv``, ``--json-file``, imported profiles) go through
:func:`write_output`, which writes them whole or not at all (:func:`write_atomic`) and turns a
full or read-only disk into one error naming the file and what to do.

No output follows a planted link: a symlink where a file goes is replaced by the file
(:func:`write_atomic`, :func:`open_output`), one where a directory goes is replaced
(:func:`replace_dir`) or refused (:func:`output_dir`). Nothing is created at a link's target,
a dangling link's included. Directories above the output are the user's layout and are
followed as given.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import IO

from sparkbuild import interrupts
from sparkbuild.errors import OutputError

MIB = 1024 * 1024
#: Specs, profiles, patches, claims, reports and the lock are all far smaller than this.
READ_LIMIT = 64 * MIB
_CHUNK = MIB


class NotARegularFileError(OSError):
    """A FIFO, device, socket or oversized file where a file's bytes were expected."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def describe_size(size: int) -> str:
    return f"{size / MIB:.0f} MiB" if size >= MIB else f"{size} bytes"


def _too_large(path: Path, limit: int) -> NotARegularFileError:
    return NotARegularFileError(
        errno.EFBIG, f"is larger than {describe_size(limit)}, more than sparkbuild reads", str(path)
    )


def read_bytes(path: Path, *, limit: int = READ_LIMIT) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Raises ``FileNotFoundError``, ``IsADirectoryError``, or another ``OSError`` (a symlink
    loop, a FIFO or device, a file over ``limit``) whose ``strerror`` says which.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)  # O_NONBLOCK: opening a FIFO does not wait for a writer
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "is a symlink loop, not a file", str(path)) from None
        raise
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFileError(
                errno.EINVAL, f"is a {_kind(info.st_mode)}, not a regular file", str(path)
            )
        if info.st_size > limit:  # refused before a byte is read
            raise _too_large(path, limit)
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, _CHUNK):
            total += len(chunk)
            if total > limit:  # checked while reading too: the file may grow meanwhile
                raise _too_large(path, limit)
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: Path, *, limit: int = READ_LIMIT) -> str:
    """:func:`read_bytes` decoded as UTF-8 (``UnicodeDecodeError`` when it is not)."""
    return read_bytes(path, limit=limit).decode("utf-8")


def reason(exc: OSError) -> str:
    """Why a file operation failed, in words (no errno numbers, no repr)."""
    return exc.strerror or str(exc)


def _stream(path: Path) -> bool:
    """``/dev/stdout``, ``/dev/fd/3``, ``/proc/self/fd/1``: a link to whatever that
    descriptor is (a redirected file too), written through, never replaced."""
    return path.is_absolute() and path.parts[1:2] in (("dev",), ("proc",))


def _refuse_link(path: Path) -> None:
    if os.path.islink(path):
        raise OSError(errno.ELOOP, "is a symlink; sparkbuild never writes through one", str(path))


def write_atomic(path: Path, data: str | bytes) -> None:
    """``data`` whole at ``path`` or not at all: written to a temporary file beside it,
    flushed to disk, then renamed over it. Interrupted or failed at any point, the previous
    file is intact and the temporary one gone. A new file is 0644, a replaced one keeps its
    mode (mkstemp's 0600 would follow the rename).

    A symlink at ``path`` is replaced by the file, never written through: a link planted
    where an output goes (a dangling one too) cannot make sparkbuild write at its target. A
    device or FIFO (``--json-file /dev/stdout``) is written as it is: there is nothing to
    swap."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        info: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    link = info is not None and stat.S_ISLNK(info.st_mode)
    if _stream(path) or (info is not None and not link and not stat.S_ISREG(info.st_mode)):
        with open(path, "wb") as stream:
            stream.write(raw)
        return
    mode = stat.S_IMODE(info.st_mode) if info is not None and not link else 0o644
    fd, scratch = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(scratch, path)  # over a symlink: the link goes, its target is untouched
    except BaseException:  # Ctrl-C and SIGTERM (interrupts.py) too: no scratch is left
        Path(scratch).unlink(missing_ok=True)
        raise


def open_output(path: Path) -> IO[str]:
    """``path`` opened for writing as a stream (an engine's log, written line by line): a
    symlink at ``path`` is removed first and never followed (``O_NOFOLLOW``: one planted
    meanwhile is refused); ``/dev/stderr`` and the like are written through."""
    if _stream(path):
        return open(path, "w", encoding="utf-8")
    if os.path.islink(path):
        path.unlink()
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            _refuse_link(path)
        raise
    return os.fdopen(fd, "w", encoding="utf-8")


def resolve_parent(path: Path) -> Path:
    """``path`` made absolute with the directories above it resolved and its last part left
    as it is: a symlink there stays a symlink, to be replaced or refused, not followed."""
    if path.name in ("", ".."):
        return path.resolve()
    return path.parent.resolve() / path.name


def project_output(root: Path, relative: str | Path, option: str | None = None) -> Path:
    """``root / relative``, a default output inside the project (``smoke/NAME.yaml``,
    ``.sparkbuild/report``): refused (OutputError) when a directory on the way is a symlink,
    since a project (a cloned one too) may carry links that point out of it."""
    path = root / relative
    here = root
    for part in Path(relative).parts[:-1]:
        here = here / part
        if os.path.islink(here):
            raise OutputError(
                f"{path}: {here} is a symlink; sparkbuild never writes its own files through one",
                f"remove the link (it points to {os.readlink(here)})"
                + (f", or pass {option}" if option else ""),
            )
    return path


def output_dir(path: Path) -> Path:
    """The directory ``path``, made with its parents where it is missing, for outputs
    written into it; a symlink there (a dangling one too) is refused, never followed."""
    _refuse_link(path)
    path.mkdir(parents=True, exist_ok=True)
    _refuse_link(path)  # planted between the two
    return path


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap the directories ``a`` and ``b`` in one step (Linux renameat2); False where the
    system or file system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    done = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if done == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def replace_dir(staging: Path, target: Path) -> None:
    """The directory ``staging`` becomes ``target``, and what was there before goes: in one
    step where the system can swap them, and never interrupted between steps (Ctrl-C and
    SIGTERM wait for it, ``interrupts.deferred``). Stopped at any point, ``target`` holds
    the previous directory or the new one, and no scratch is left beside it. A symlink at
    ``target`` is replaced, never followed: what it points to is left as it was."""
    with interrupts.deferred():
        if not os.path.lexists(target):
            staging.rename(target)
            return
        if not _exchange(staging, target):
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            target.rename(old)
            staging.rename(target)
            staging = old
        if staging.is_symlink():  # a link was at target: it goes, what it points to stays
            staging.unlink()
        else:
            shutil.rmtree(staging, ignore_errors=True)


def write_output(path: Path, data: str | bytes, option: str) -> None:
    """Write an output file (``--markdown FILE``) atomically (:func:`write_atomic`); a full
    or read-only disk is an error naming the file, not a traceback."""
    try:
        write_atomic(path, data)
    except OSError as exc:
        raise OutputError(
            f"{option} {path}: cannot write: {reason(exc)}",
            f"free space on that disk, or pass a writable path to {option}",
        ) from exc


__all__ = [
    "READ_LIMIT",
    "NotARegularFileError",
    "open_output",
    "output_dir",
    "project_output",
    "read_bytes",
    "read_text",
    "reason",
    "replace_dir",
    "resolve_parent",
    "write_atomic",
    "write_output",
]
