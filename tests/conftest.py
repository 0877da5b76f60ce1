from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import cli
from tests.support.cache import shared_test_cache
from tests.support.sglang_releases import ALL_RELEASES, sglang_release_repo


@pytest.fixture(scope="session")
def test_cache() -> Path:
    """Downloads and slow-to-make artifacts shared across runs (PyPI files, base images)."""
    return shared_test_cache()


@pytest.fixture(scope="session")
def release_repo(test_cache: Path) -> Path:
    """The local SGLang repository with one tagged commit per release (from PyPI wheels):
    what the tests of each shipped patch check out and apply to."""
    return sglang_release_repo(test_cache, ALL_RELEASES)


@pytest.fixture(autouse=True)
def _fast_network_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    # Unreachable remotes are part of the tests; do not wait out real backoff.
    monkeypatch.setenv("SPARKBUILD_NET_ATTEMPTS", os.environ.get("SPARKBUILD_NET_ATTEMPTS", "2"))
    monkeypatch.setenv("SPARKBUILD_NET_BACKOFF", "0")


@pytest.fixture
def run_cli() -> cli.RunCli:
    """``run_cli(*args, cwd=, input=, env=, process=False)`` -> exit_code/stdout/stderr/output.

    The one way a test starts sparkbuild: in-process by default, the installed console
    script with ``process=True`` (see tests/support/cli.py for when that is the point)."""
    return cli.run_cli
