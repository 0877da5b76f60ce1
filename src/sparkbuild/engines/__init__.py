"""Inference engines: what sparkbuild knows about each, and running and talking to them.

:mod:`~.adapters` (one module per engine, and the registry of engines: every stage from the
spec on reads it), :mod:`~.versions` (engine-neutral version facts). Smoke and bench launch
engines through :mod:`~.targets` (where an engine runs), :mod:`~.profiles` (what to serve,
from ``smoke/<name>.yaml``), :mod:`~.prompts` (the profiles' built-in prompt sets),
:mod:`~.launch` (a profile and ``--image``/``--command``/``--url`` made into a target; mounts;
settled counters), :mod:`~.signatures` (known failures in engine logs), :mod:`~.logs`,
:mod:`~.lifeline`; this package re-exports only what sits before the spec stage.
"""

from sparkbuild.engines.adapters import (
    ADAPTERS,
    Acceptance,
    Counters,
    EngineAdapter,
    Generation,
    adapter_for,
    engine_names,
    parse_prometheus,
)
from sparkbuild.errors import EngineHTTPError

__all__ = [
    "ADAPTERS",
    "Acceptance",
    "Counters",
    "EngineAdapter",
    "EngineHTTPError",
    "Generation",
    "adapter_for",
    "engine_names",
    "parse_prometheus",
]
