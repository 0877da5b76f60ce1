"""Running and talking to inference engines: targets (where) and adapters (which engine).

Public API shared by the smoke and bench stages; see :mod:`sparkbuild.engines.targets` and
:mod:`sparkbuild.engines.adapters`.
"""

from sparkbuild.engines.adapters import (
    ADAPTERS,
    Acceptance,
    Counters,
    EngineAdapter,
    Generation,
    SglangAdapter,
    VllmAdapter,
    adapter_for,
    parse_prometheus,
)
from sparkbuild.engines.logs import LogBuffer
from sparkbuild.engines.targets import (
    ContainerTarget,
    Mount,
    ProcessTarget,
    Readiness,
    Target,
    UrlTarget,
    free_port,
    wait_ready,
)
from sparkbuild.errors import EngineHTTPError

__all__ = [
    "ADAPTERS",
    "Acceptance",
    "ContainerTarget",
    "Counters",
    "EngineAdapter",
    "EngineHTTPError",
    "Generation",
    "LogBuffer",
    "Mount",
    "ProcessTarget",
    "Readiness",
    "SglangAdapter",
    "Target",
    "UrlTarget",
    "VllmAdapter",
    "adapter_for",
    "free_port",
    "parse_prometheus",
    "wait_ready",
]
