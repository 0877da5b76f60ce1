"""Running and talking to inference engines, shared by the smoke and bench stages.

:mod:`~sparkbuild.engines.targets` (where an engine runs), :mod:`~.adapters` (which engine),
:mod:`~.profiles` (what to serve, from ``smoke/<name>.yaml``), :mod:`~.prompts` (the
profiles' built-in prompt sets), :mod:`~.launch` (a profile and ``--image``/``--command``/
``--url`` made into a target; mounts; settled counters), :mod:`~.signatures` (known failures
in engine logs), :mod:`~.versions`, :mod:`~.logs`, :mod:`~.lifeline`.
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
