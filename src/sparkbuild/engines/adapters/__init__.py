"""One adapter per engine: its launch flags, endpoints, counters and log formats.

``base`` holds :class:`EngineAdapter` and the engine-neutral values (:class:`Generation`,
:class:`Counters`, :class:`Acceptance`); ``vllm`` and ``sglang`` hold one engine each (as
cibuildwheel keeps one module per platform); ``known`` maps an engine's name to its adapter.
"""

from sparkbuild.engines.adapters.base import (
    MAX_TOKENS,
    VERSION_PATHS,
    Acceptance,
    Counters,
    EngineAdapter,
    Generation,
    RankCommand,
    RankPlace,
    first_model,
    non_finite,
    parse_prometheus,
    reported_version,
    whole_number,
)
from sparkbuild.engines.adapters.known import ADAPTERS, adapter_for
from sparkbuild.engines.adapters.sglang import SglangAdapter
from sparkbuild.engines.adapters.vllm import VllmAdapter

__all__ = [
    "ADAPTERS",
    "MAX_TOKENS",
    "VERSION_PATHS",
    "Acceptance",
    "Counters",
    "EngineAdapter",
    "Generation",
    "RankCommand",
    "RankPlace",
    "SglangAdapter",
    "VllmAdapter",
    "adapter_for",
    "first_model",
    "non_finite",
    "parse_prometheus",
    "reported_version",
    "whole_number",
]
