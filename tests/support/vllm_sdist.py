"""The vLLM 0.33.0 sdist from PyPI, downloaded once into the shared test cache."""

from __future__ import annotations

from pathlib import Path

import requests
from filelock import FileLock

from tests.support.cache import shared_test_cache

VLLM_SDIST = (
    "https://files.pythonhosted.org/packages/f7/25/"
    "aa5684e9c59d6fc75f78926b7f15e8d9adc7de2d9e6e7575b80776ad8169/vllm-0.33.0.tar.gz"
)


def vllm_sdist() -> Path:
    target = shared_test_cache() / "downloads" / "vllm-0.33.0.tar.gz"
    with FileLock(str(target) + ".lock"):
        if not target.exists():
            partial = target.with_suffix(".part")
            with requests.get(VLLM_SDIST, stream=True, timeout=300) as response:
                response.raise_for_status()
                with partial.open("wb") as out:
                    for chunk in response.iter_content(1 << 20):
                        out.write(chunk)
            partial.rename(target)
    return target
