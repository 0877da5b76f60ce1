"""Preflight: run the engine's own Python boot path on the CPU, before any GPU.

For a build and each profile it lists, a probe (``data/preflight/probe.py``) runs under the
target interpreter, in a cached local venv (the patched tree over the release's own
dependencies) or inside the built image with no GPU, and checks:

* compile: every changed file compiles;
* imports: every changed module and every module importing one imports; the model registry
  has no more failing classes than the unpatched release;
* signals: every metric and response field the smoke/bench adapters rely on exists;
* flags / env / config, per profile: the engine's parser takes every flag, every variable
  the profile sets is read by that version, and the server config builds from the flags
  against a config-only model directory, including the reserved-token computation, the
  speculative defaults and the draft config loading.

See docs/preflight.md.
"""

from sparkbuild.preflight.record import record
from sparkbuild.preflight.report import PreflightReport
from sparkbuild.preflight.stage import changed_in_package, report_json, run_preflight
from sparkbuild.preflight.where import Where, build_pins

__all__ = [
    "PreflightReport",
    "Where",
    "build_pins",
    "changed_in_package",
    "record",
    "report_json",
    "run_preflight",
]
