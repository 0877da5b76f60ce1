"""One adapter per engine: everything sparkbuild knows about it, behind one interface.

``base`` holds :class:`EngineAdapter`; ``values`` the engine-neutral values it answers in
(:class:`Generation`, :class:`Counters`, :class:`Acceptance`); ``facts`` the frozen facts
each stage reads off an adapter; ``versions`` the engine-neutral version values; every other
module here is one engine (as cibuildwheel keeps one module per platform), registered by
``known`` under its name.
"""

from sparkbuild.adapters.answers import ChatAnswer
from sparkbuild.adapters.base import EngineAdapter
from sparkbuild.adapters.facts import (
    BenchCounters,
    BinaryPreflight,
    Moved,
    PreflightFacts,
    ProbeFacts,
    RecipeFacts,
    ReleaseTags,
    SourceBuild,
)
from sparkbuild.adapters.known import (
    ADAPTERS,
    EngineName,
    LauncherName,
    adapter_for,
    adapter_type,
    engine_names,
    launcher_names,
    register,
    unregister,
)
from sparkbuild.adapters.values import (
    MAX_TOKENS,
    Acceptance,
    Counters,
    Generation,
    Layout,
    PositionCounts,
    RankCommand,
    RankPlace,
    first_model,
    non_finite,
    parse_prometheus,
    reported_version,
    whole_number,
)

__all__ = [
    "ADAPTERS",
    "MAX_TOKENS",
    "Acceptance",
    "BenchCounters",
    "BinaryPreflight",
    "ChatAnswer",
    "Counters",
    "EngineAdapter",
    "EngineName",
    "Generation",
    "LauncherName",
    "Layout",
    "Moved",
    "PositionCounts",
    "PreflightFacts",
    "ProbeFacts",
    "RankCommand",
    "RankPlace",
    "RecipeFacts",
    "ReleaseTags",
    "SourceBuild",
    "adapter_for",
    "adapter_type",
    "engine_names",
    "first_model",
    "launcher_names",
    "non_finite",
    "parse_prometheus",
    "register",
    "reported_version",
    "unregister",
    "whole_number",
]
