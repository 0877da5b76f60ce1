"""The engines sparkbuild knows, by name: the one place a new engine's adapter is added."""

from __future__ import annotations

from typing import Any

from sparkbuild.engines.adapters.base import EngineAdapter
from sparkbuild.engines.adapters.sglang import SglangAdapter
from sparkbuild.engines.adapters.vllm import VllmAdapter
from sparkbuild.errors import UsageError

ADAPTERS: dict[str, type[EngineAdapter]] = {
    adapter.name: adapter for adapter in (VllmAdapter, SglangAdapter)
}


def adapter_for(engine: str, **kwargs: Any) -> EngineAdapter:
    try:
        return ADAPTERS[engine](**kwargs)
    except KeyError:
        known = ", ".join(sorted(ADAPTERS))
        raise UsageError(f"unknown engine {engine!r}; known engines: {known}") from None
