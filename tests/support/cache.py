"""The one cache shared by all test runs on this machine: PyPI downloads, root filesystems,
the vLLM CPU venv and tiny models. ``SPARKBUILD_TEST_CACHE`` moves it (CI can start empty)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock, Timeout

READY = ".sparkbuild-ready"


def shared_test_cache() -> Path:
    default = Path.home() / ".cache" / "sparkbuild-tests"
    path = Path(os.environ.get("SPARKBUILD_TEST_CACHE", default)).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_once(
    path: Path,
    build: Callable[[Path], None],
    stamp: str = "ok\n",
    *,
    say: Callable[[str], None] | None = None,
) -> Path:
    """``path``, made by ``build(path)`` once per machine. Concurrent runs wait on a file
    lock (``say`` is told whose, by pid, once, before the wait); the ready marker is written
    last, so a directory a killed run left half made is removed and made again."""
    ready = path / READY
    if ready.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path) + ".lock")
    owner = Path(str(path) + ".owner")  # the pid holding the lock, for whoever waits on it
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if say is not None:
            holder = _read_pid(owner)
            say(f"waiting for another install of {path.name} (PID {holder or 'unknown'}) to finish")
        lock.acquire()
    try:
        owner.write_text(f"{os.getpid()}\n", encoding="utf-8")
        if not ready.exists():
            shutil.rmtree(path, ignore_errors=True)
            build(path)
            ready.write_text(stamp, encoding="utf-8")
    finally:
        owner.unlink(missing_ok=True)
        lock.release()
    return path


def _read_pid(owner: Path) -> int | None:
    try:
        text = owner.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
