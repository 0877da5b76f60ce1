"""Publish's preflight requirement: a passing preflight of the pinned image, per profile.

Only a run inside the image itself counts (``where: image`` with that image id): a local venv
run proves the tree, not what the image holds.
"""

from __future__ import annotations

from sparkbuild import console, lockfile
from sparkbuild.errors import GateClosedError
from sparkbuild.settings import Settings
from sparkbuild.spec import Build


def preflight_verdicts(
    settings: Settings, build: Build, image_id: str, entry: lockfile.BuildEntry | None = None
) -> dict[str, str]:
    """profile -> 'pass', 'fail', 'skip' or 'missing' for the image's own preflight runs.

    ``entry`` is the build's lock entry when the caller holds it (else it is read)."""
    if entry is None:
        entry = lockfile.read_entry(settings.lock_file, build.name)
    runs = [
        run
        for run in (entry.preflight or {}).values()
        if run.image_id == image_id and run.where == "image"
    ]
    verdicts = {}
    for profile in build.smoke_profiles:
        seen = [_verdict(run, profile) for run in runs]
        verdicts[profile] = "pass" if "pass" in seen else (seen[-1] if seen else "missing")
    return verdicts


def _verdict(run: lockfile.PreflightRun, profile: str) -> str:
    verdict = run.profiles.get(profile)
    if verdict is None or "verdict" not in verdict.model_fields_set:
        return "missing"
    return str(verdict.verdict)


def preflight_gate(
    settings: Settings,
    build: Build,
    image_id: str,
    *,
    force: bool,
    entry: lockfile.BuildEntry | None = None,
) -> bool:
    """Whether the pinned image passed preflight for every profile; refuses (or with
    ``force`` warns) otherwise."""
    verdicts = preflight_verdicts(settings, build, image_id, entry)
    failing = {p: v for p, v in verdicts.items() if v != "pass"}
    if not failing:
        return True
    listed = ", ".join(f"{p}: {v}" for p, v in failing.items())
    problem = f"{build.name}: image {image_id[:19]} has no passing preflight ({listed})"
    hint = f"`sparkbuild preflight {build.name} --image IMAGE --record {build.name}` records one"
    if not force:
        raise GateClosedError(problem, hint + "; --force publishes anyway, recorded unverified")
    console.warn(f"{problem}\n--force: publishing without a passing preflight")
    return False


__all__ = ["preflight_gate", "preflight_verdicts"]
