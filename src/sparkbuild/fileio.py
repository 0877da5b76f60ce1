"""Reading and writing the files sparkbuild is handed: regular files only, of bounded size.

A path in a spec, a profile, ``--lock-file`` or ``bench compare`` can name anything: a FIFO
(reading it waits for a writer forever), a device (``/dev/zero`` never ends), a symlink loop,
a file of many gigabytes. Every such read goes through :func:`read_bytes`, which opens without
blocking, refuses what is not a regular file and stops at a size limit. Its errors are
``OSError`` with a readable ``strerror``, so each caller's "cannot read FILE: why" covers them.

Outputs (``--markdown``, ``--csv``, ``--json-file``, imported profiles) go through
:func:`write_output`, which writes them whole or not at all (:func:`write_atomic`) and turns a
full or read-only disk into one error naming the file and what to do.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path

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


def write_atomic(path: Path, data: str | bytes) -> None:
    """``data`` whole at ``path`` or not at all: written to a temporary file beside it,
    flushed to disk, then renamed over it. Interrupted or failed at any point, the previous
    file is intact and the temporary one gone. A new file is 0644, a replaced one keeps its
    mode (mkstemp's 0600 would follow the rename). Through a symlink, the file it points to
    is replaced (the link stays); a device or FIFO (``--json-file /dev/stdout``) is written
    as it is: there is nothing to swap."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    target = Path(os.path.realpath(path))
    try:
        info: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    # /dev/stdout is a link to whatever fd 1 is, a redirected file too: write through it.
    streams = path.is_absolute() and path.parts[1:2] in (("dev",), ("proc",))
    if streams or (info is not None and not stat.S_ISREG(info.st_mode)):
        with open(path, "wb") as stream:
            stream.write(raw)
        return
    mode = stat.S_IMODE(info.st_mode) if info is not None else 0o644
    fd, scratch = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(scratch, target)
    except BaseException:  # Ctrl-C and SIGTERM (interrupts.py) too: no scratch is left
        Path(scratch).unlink(missing_ok=True)
        raise


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
    the previous directory or the new one, and no scratch is left beside it."""
    with interrupts.deferred():
        if not os.path.lexists(target):
            staging.rename(target)
            return
        if not _exchange(staging, target):
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            target.rename(old)
            staging.rename(target)
            staging = old
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
    "read_bytes",
    "read_text",
    "reason",
    "replace_dir",
    "write_atomic",
    "write_output",
]
