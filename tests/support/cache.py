"""The one cache shared by all test runs on this machine: PyPI downloads, root filesystems,
the vLLM CPU venv and tiny models. ``SPARKBUILD_TEST_CACHE`` moves it (CI can start empty)."""

from __future__ import annotations

import os
from pathlib import Path


def shared_test_cache() -> Path:
    default = Path.home() / ".cache" / "sparkbuild-tests"
    path = Path(os.environ.get("SPARKBUILD_TEST_CACHE", default)).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path
