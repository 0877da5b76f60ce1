"""Preflight verdicts in images.lock, keyed by tree and dependency set."""

from __future__ import annotations

from typing import Any

from sparkbuild.preflight.report import PreflightReport
from sparkbuild.settings import Settings

SECTION = "preflight"


def record(settings: Settings, report: PreflightReport) -> None:
    """``builds.<build>.preflight.<tree>+<deps>``; other keys (and, under the same key, the
    verdicts of profiles this run did not check) stay."""
    from sparkbuild import lock as lockfile

    def mutate(data: dict[str, Any]) -> None:
        entry = data["builds"].setdefault(report.build, {})
        section = entry.get(SECTION)
        if not isinstance(section, dict):
            section = entry[SECTION] = {}
        value = report.lock_value()
        earlier = section.get(report.key)
        if isinstance(earlier, dict) and isinstance(earlier.get("profiles"), dict):
            # Same tree and dependencies: a run of other profiles adds to the verdicts.
            value["profiles"] = {**earlier["profiles"], **value["profiles"]}
        section[report.key] = value

    lockfile.update(settings.lock_file, mutate)
