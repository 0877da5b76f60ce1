"""Preflight verdicts in images.lock, keyed by tree and dependency set."""

from __future__ import annotations

from sparkbuild import lockfile
from sparkbuild.preflight.report import PreflightReport
from sparkbuild.settings import Settings


def record(settings: Settings, report: PreflightReport) -> None:
    """``builds.<build>.preflight.<tree>+<deps>``; other keys (and, under the same key, the
    verdicts of profiles this run did not check) stay."""
    run = lockfile.PreflightRun.from_report(report)

    def change(entry: lockfile.BuildEntry) -> None:
        runs = entry.preflight or {}
        earlier = runs.get(report.key)
        if earlier is not None and "profiles" in earlier.model_fields_set:
            # Same tree and dependencies: a run of other profiles adds to the verdicts.
            run.profiles = {**earlier.profiles, **run.profiles}
        entry.preflight = {**runs, report.key: run}

    lockfile.update_entry(settings.lock_file, report.build, change)
