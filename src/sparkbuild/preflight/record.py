"""Preflight verdicts in images.lock, keyed by tree and dependency set, made from the
stage's own report."""

from __future__ import annotations

from sparkbuild import lockfile
from sparkbuild.engines.host_record import host_record
from sparkbuild.preflight.report import PreflightReport
from sparkbuild.settings import Settings


def preflight_run(report: PreflightReport) -> lockfile.PreflightRun:
    """One run's verdicts (per profile), not their details."""
    run = lockfile.PreflightRun(
        where=report.where,
        tree=report.tree,
        deps_digest=report.deps_digest,
        versions={name: str(v) for name, v in report.versions.items() if v},
        checks={c.name: c.status for c in report.package_checks},
        profiles={
            p.profile: lockfile.ProfileVerdict(
                verdict=report.verdict_for(p), checks={c.name: c.status for c in p.checks}
            )
            for p in report.profiles
        },
    )
    if report.image_id:
        run.image_id = report.image_id
    hosts = host_record({"nodes": [report.host.to_json()]}) if report.host else None
    if hosts is not None:
        run.hosts = hosts
    return run


def record(settings: Settings, report: PreflightReport) -> None:
    """``builds.<build>.preflight.<tree>+<deps>``; other keys (and, under the same key, the
    verdicts of profiles this run did not check) stay."""
    run = preflight_run(report)

    def change(entry: lockfile.BuildEntry) -> None:
        runs = entry.preflight or {}
        earlier = runs.get(report.key)
        if earlier is not None and "profiles" in earlier.model_fields_set:
            # Same tree and dependencies: a run of other profiles adds to the verdicts.
            run.profiles = {**earlier.profiles, **run.profiles}
        entry.preflight = {**runs, report.key: run}

    lockfile.update_entry(settings.lock_file, report.build, change)
