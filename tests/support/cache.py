"""The one cache shared by all test runs on this machine: PyPI downloads, root filesystems,
the vLLM CPU venv and tiny models. ``SPARKBUILD_TEST_CACHE`` moves it (CI can start empty)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

READY = ".sparkbuild-ready"


def shared_test_cache() -> Path:
    default = Path.home() / ".cache" / "sparkbuild-tests"
    path = Path(os.environ.get("SPARKBUILD_TEST_CACHE", default)).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_once(path: Path, build: Callable[[Path], None], stamp: str = "ok\n") -> Path:
    """``path``, made by ``build(path)`` once per machine. Concurrent runs wait on a file
    lock; the ready marker is written last, so a directory a killed run left half made is
    removed and made again."""
    ready = path / READY
    if ready.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if not ready.exists():
            shutil.rmtree(path, ignore_errors=True)
            build(path)
            ready.write_text(stamp, encoding="utf-8")
    return path
