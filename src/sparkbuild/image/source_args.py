"""Build arguments of the source templates that depend on the engine release.

The upstream trees move between releases; each move is one row of the engine's
``source_build`` (its adapter module), with the range it covers and where it was read, the
same way patches carry `when` ranges. sparkbuild passes these as build arguments (so they
feed the inputs digest); a spec's own `build_args` win.
"""

from __future__ import annotations

from sparkbuild import templates
from sparkbuild.adapters import adapter_type
from sparkbuild.spec import Build

# Memory per parallel compile job: a sm_121a CUTLASS/FlashInfer nvcc job peaks at 10-12 GiB
# (community Spark builds: 16 jobs at one nvcc thread each still ran out of 119 GiB).
GIB_PER_JOB = 11


def default_base(build: Build) -> str | None:
    """The engine's release image for ``build`` (the default source base), if it has one."""
    template = adapter_type(build.engine).source_build.base_image
    return templates.fill(template, {"version": str(build.version)}) if template else None


def source_args(build: Build) -> dict[str, str]:
    """The version-dependent build arguments of ``build``'s engine template."""
    facts = adapter_type(build.engine).source_build
    return {
        **facts.args,
        "CUDA_VERSION": "13.0",
        "ENGINE_VERSION": str(build.version),
        "GIB_PER_JOB": str(GIB_PER_JOB),
        **facts.moved_args(build.version),
    }
