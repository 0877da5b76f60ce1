"""The bench runs beside the lock: the JSON reports ``bench --json-file`` wrote, matched to
the lock's bench records, and the claims each run is held against.

The lock keeps a summary of each recorded run (``bench.<image_id>.<profile>``: medians per
cell, the engine's arguments, the harness, the host). The run's own JSON has the rest: min and
max over runs, the flags naming each burst or stray run, the model and the prompts, which the
claims comparison needs. A JSON file belongs to a build when its ``target.image_id`` is one of
the images the build's lock entry knows; it is that build's record when the profile (or
label) and ``created`` match too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkbuild import lockfile
from sparkbuild.bench import claims_report
from sparkbuild.bench.claims import LoadedClaim, load_claim_files
from sparkbuild.bench.report import load_report
from sparkbuild.bench.results import BenchReport
from sparkbuild.errors import UsageError
from sparkbuild.settings import Settings


@dataclass(frozen=True)
class RunFile:
    """One bench report read from disk."""

    path: Path
    report: BenchReport

    @property
    def key(self) -> str:
        """Where ``bench --record`` files it under an image: the profile, else the label."""
        return self.report.profile or self.report.label


@dataclass(frozen=True)
class RunMatch:
    """A run file attached to a build: exactly its lock record, or only its image."""

    run: RunFile
    build: str
    image_id: str
    recorded: bool  # the lock has this very run (same key and `created`)
    claims: claims_report.ClaimsComparison | None = None
    attached: bool = False  # named for the build by the user (`report --attach BUILD=FILE`)


@dataclass(frozen=True)
class BenchRuns:
    matched: tuple[RunMatch, ...] = ()
    unmatched: tuple[tuple[Path, str], ...] = ()  # (file, why)

    def for_build(self, build: str) -> list[RunMatch]:
        return [m for m in self.matched if m.build == build]

    def for_record(self, build: str, image_id: str, key: str) -> RunMatch | None:
        return next(
            (
                m
                for m in self.matched
                if m.build == build and m.image_id == image_id and m.recorded and m.run.key == key
            ),
            None,
        )


def read_runs(directories: Sequence[Path]) -> tuple[list[RunFile], list[tuple[Path, str]]]:
    """Every ``*.json`` under ``directories`` that is a bench report; the others, with why."""
    runs: list[RunFile] = []
    skipped: list[tuple[Path, str]] = []
    for directory in directories:
        if not directory.is_dir():
            raise UsageError(
                f"--bench-runs {directory}: no such directory",
                "pass the directory your `sparkbuild bench ... --json-file` reports are in",
            )
        for path in sorted(directory.rglob("*.json")):
            try:
                runs.append(RunFile(path, load_report(path)))
            except UsageError as exc:
                skipped.append((path, exc.message))
    return runs, skipped


def attach_runs(
    lock: lockfile.LockFile, attached: Sequence[tuple[str, Path]], claims: Sequence[LoadedClaim]
) -> list[RunMatch]:
    """Runs the user names for a build (``--attach BUILD=FILE``): a ``--command`` or
    ``--url`` run, such as the quick start's, names no image to match by. It is shown as
    attached, never as the build's record."""
    matched = []
    for build, path in attached:
        if build not in lock.builds:
            raise UsageError(
                f"--attach {build}={path}: no build {build!r} in the lock",
                f"name one of: {', '.join(sorted(lock.builds)) or '(none: run `sparkbuild lock`)'}",
            )
        report = load_report(path)
        comparison = claims_report.compare_claims(report, claims) if claims else None
        if comparison is not None and not comparison.rows:
            comparison = None
        image_id = report.target.image_id or ""
        matched.append(RunMatch(RunFile(path, report), build, image_id, False, comparison, True))
    return matched


def match_runs(
    lock: lockfile.LockFile,
    runs: Sequence[RunFile],
    claims: Sequence[LoadedClaim],
) -> BenchRuns:
    """Each run attached to the build whose lock entry knows its image."""
    images: dict[str, str] = {}  # image id -> build
    for name, entry in lock.builds.items():
        for known in _known_images(entry):
            images.setdefault(known, name)
    matched: list[RunMatch] = []
    unmatched: list[tuple[Path, str]] = []
    for run in runs:
        image_id = run.report.target.image_id
        build = images.get(image_id or "")
        if image_id is None or build is None:
            why = (
                "the run names no image (a --command or --url run)"
                if image_id is None
                else f"no build in the lock has image {image_id[:19]}"
            )
            unmatched.append((run.path, why))
            continue
        entry = lock.builds[build]
        record = ((entry.bench or {}).get(image_id) or {}).get(run.key)
        recorded = record is not None and record.created == run.report.created
        comparison = claims_report.compare_claims(run.report, claims) if claims else None
        if comparison is not None and not comparison.rows:
            comparison = None
        matched.append(RunMatch(run, build, image_id, recorded, comparison))
    return BenchRuns(tuple(matched), tuple(unmatched))


def _known_images(entry: lockfile.BuildEntry) -> list[str]:
    found = [entry.image.image_id] if entry.image and entry.image.image_id else []
    found += list(entry.bench or {}) + list(entry.smoke or {})
    return found


def project_claims(settings: Settings) -> list[LoadedClaim]:
    """Every claims file in the project's ``claims/``."""
    directory = settings.project_dir / "claims"
    files = sorted(str(p) for p in directory.glob("*.y*ml")) if directory.is_dir() else []
    return load_claim_files(settings, files)
