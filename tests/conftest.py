from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.cache import shared_test_cache


@pytest.fixture(scope="session")
def test_cache() -> Path:
    """Downloads and slow-to-make artifacts shared across runs (PyPI files, base images)."""
    return shared_test_cache()


@pytest.fixture(autouse=True)
def _fast_network_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    # Unreachable remotes are part of the tests; do not wait out real backoff.
    monkeypatch.setenv("SPARKBUILD_NET_ATTEMPTS", os.environ.get("SPARKBUILD_NET_ATTEMPTS", "2"))
    monkeypatch.setenv("SPARKBUILD_NET_BACKOFF", "0")
