"""What the report shows of one build: a verdict per stage (the index's row) and the details
of its page, read from the build's lock entry.

Each stage's cell has a verdict, the date its record last changed and, where the stage knows
the notion, whether it was verified. A cell is **red** when something needed failed or is
missing, and **stale** when it is about something other than what the lock pins now (an
older image, another source tree) or older than ``stale_days``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from sparkbuild import fileio, git, lockfile, validate
from sparkbuild.checks import Status, combined
from sparkbuild.errors import SparkbuildError
from sparkbuild.image import labels as image_labels
from sparkbuild.redact import strip_userinfo
from sparkbuild.report.charts import CellFigures, Chart, bench_charts
from sparkbuild.report.dates import LockDates, RecordDate
from sparkbuild.report.runs import BenchRuns, RunMatch
from sparkbuild.source.mirror import Mirror, trusted_mirrors

Tone = Literal["good", "bad", "warn", "stale", "none"]
STAGES = ("source", "image", "preflight", "smoke", "bench", "publish")
BAD_ITEMS = ("conflict", "missing", "invalid")


@dataclass(frozen=True)
class StageCell:
    """One stage of one build, as the index shows it."""

    stage: str
    verdict: str
    tone: Tone
    date: RecordDate | None = None
    verified: bool | None = None  # None: the stage has no such notion, or nothing ran
    label: str | None = None  # the profile or repository of a per-profile cell
    notes: tuple[str, ...] = ()

    @property
    def stands_out(self) -> bool:
        return self.tone in ("bad", "stale")


@dataclass(frozen=True)
class Context:
    """What every build's view is read against."""

    dates: LockDates
    now: datetime
    stale_days: float
    project_dir: Path | None = None  # where patch files are read from (None: not read)


def _aged(cell: StageCell, context: Context) -> StageCell:
    """A verdict recorded longer ago than ``stale_days`` is stale (a red one stays red)."""
    age = cell.date.age_days(context.now) if cell.date else None
    if age is None or age <= context.stale_days or cell.tone in ("bad", "none"):
        return cell
    note = f"recorded {int(age)} days ago (stale after {context.stale_days:g})"
    return replace(cell, tone="stale", notes=(*cell.notes, note))


def current_image(entry: lockfile.BuildEntry) -> str | None:
    return entry.image.image_id if entry.image else None


def short(value: str | None, length: int = 12) -> str:
    """A digest or commit, shortened for a table (``sha256:`` kept)."""
    if not value:
        return "-"
    prefix = "sha256:" if value.startswith("sha256:") else ""
    return prefix + value[len(prefix) : len(prefix) + length]


# --- the index row -------------------------------------------------------------------------


def source_cell(name: str, entry: lockfile.BuildEntry, context: Context) -> StageCell:
    source = entry.source
    date = context.dates.of("builds", name, "source")
    if source is None:
        return StageCell("source", "not locked", "bad", notes=(f"sparkbuild lock {name}",))
    items: list[lockfile.LockedPR | lockfile.LockedPatch | lockfile.LockedStep] = [
        *source.prs,
        *source.patches,
        *source.steps,
    ]
    bad = [item for item in items if item.status in BAD_ITEMS]
    if bad:
        statuses = sorted({str(item.status) for item in bad})
        return StageCell("source", "/".join(statuses), "bad", date, notes=_item_words(bad))
    counts = f"{_count(len(source.prs), 'PR')}, {_count(len(source.patches), 'patch', 'patches')}"
    return StageCell("source", "locked", "good", date, notes=(counts,))


def _item_words(
    items: Iterable[lockfile.LockedPR | lockfile.LockedPatch | lockfile.LockedStep],
) -> tuple[str, ...]:
    words = []
    for item in items:
        if isinstance(item, lockfile.LockedPR):
            words.append(f"PR #{item.number}: {item.status}")
        elif isinstance(item, lockfile.LockedPatch):
            words.append(f"{item.file}: {item.status}")
        else:
            words.append(f"{item.step} {item.file}: {item.status}")
    return tuple(words)


def image_cell(name: str, entry: lockfile.BuildEntry, context: Context) -> StageCell:
    image = entry.image
    if image is None or not image.image_id:
        return StageCell("image", "not built", "bad", notes=(f"sparkbuild build {name}",))
    date = context.dates.of("builds", name, "image")
    tree = entry.source.tree if entry.source else None
    if tree and image.tree and image.tree != tree:
        note = f"built from tree {short(image.tree)}; the lock's source is {short(tree)}"
        return StageCell("image", "built", "stale", date, notes=(note,))
    return StageCell("image", "built", "good", date, notes=(short(image.image_id, 19),))


def run_verdict(run: lockfile.PreflightRun) -> Status:
    """A preflight run's verdict: its build-wide checks and every profile's verdict."""
    statuses: list[Status] = list(run.checks.values())
    statuses += [p.verdict for p in run.profiles.values() if p.verdict]
    return combined(statuses)


def preflight_cell(name: str, entry: lockfile.BuildEntry, context: Context) -> StageCell:
    runs = entry.preflight or {}
    if not runs:
        return StageCell("preflight", "missing", "bad", notes=(f"sparkbuild preflight {name}",))
    image_id = current_image(entry)
    tree = entry.source.tree if entry.source else None
    in_image = {k: r for k, r in runs.items() if r.where == "image" and r.image_id == image_id}
    of_tree = {k: r for k, r in runs.items() if tree and r.tree == tree}
    chosen, verified = (in_image, True) if in_image else (of_tree, False)
    if not chosen:
        key = next(iter(runs))
        date = context.dates.of("builds", name, "preflight", key)
        note = "for another tree or image than the lock pins"
        return StageCell("preflight", run_verdict(runs[key]), "stale", date, False, notes=(note,))
    verdicts = {k: run_verdict(r) for k, r in chosen.items()}
    key = next((k for k, v in verdicts.items() if v == "pass"), next(iter(verdicts)))
    verdict = verdicts[key]
    date = context.dates.of("builds", name, "preflight", key)
    notes: tuple[str, ...] = ()
    if verdict == "fail":
        tone: Tone = "bad"
    elif verdict == "skip":
        tone, notes = "warn", ("checks skipped: publish needs a pass",)
    elif not verified:
        tone, notes = "warn", (f"a {chosen[key].where} run: proves the tree, not the image",)
    else:
        tone = "good"
    return _aged(StageCell("preflight", verdict, tone, date, verified, notes=notes), context)


def smoke_cells(
    name: str, entry: lockfile.BuildEntry, profiles: Sequence[str], context: Context
) -> list[StageCell]:
    image_id = current_image(entry)
    records = entry.smoke or {}
    current = records.get(image_id or "") or {}
    older = {
        profile: (other_id, record)
        for other_id, by_profile in records.items()
        if other_id != image_id
        for profile, record in by_profile.items()
    }
    names = list(dict.fromkeys([*profiles, *current, *older]))
    cells = []
    for profile in names:
        record = current.get(profile)
        if record is not None:
            cell = _smoke_cell(name, image_id or "", profile, record, context)
            cells.append(_aged(cell, context))
        elif profile in older:
            other_id, old = older[profile]
            note = f"for an older image ({short(other_id, 19)})"
            date = context.dates.of("builds", name, "smoke", other_id, profile)
            verified = old.image_verified(other_id)
            cells.append(
                StageCell("smoke", str(old.verdict), "stale", date, verified, profile, (note,))
            )
        else:
            hint = f"sparkbuild smoke --image IMAGE --profile {profile} --record {name}"
            cells.append(StageCell("smoke", "missing", "bad", label=profile, notes=(hint,)))
    return cells


def _smoke_cell(
    name: str, image_id: str, profile: str, record: lockfile.SmokeRecord, context: Context
) -> StageCell:
    date = context.dates.of("builds", name, "smoke", image_id, profile)
    verified = record.image_verified(image_id)
    if record.verdict == "fail":
        failed = [check for check, status in record.checks.items() if status == "fail"]
        notes = (f"failed: {', '.join(failed)}",) if failed else ()
        return StageCell("smoke", "fail", "bad", date, verified, profile, notes)
    if not verified:
        note = (
            f"unverified: a {record.target_kind} run "
            f"({record.target or 'unknown target'}; publish does not count it)"
        )
        return StageCell("smoke", str(record.verdict), "warn", date, False, profile, (note,))
    return StageCell("smoke", str(record.verdict), "good", date, True, profile)


def bench_cells(name: str, entry: lockfile.BuildEntry, context: Context) -> list[StageCell]:
    image_id = current_image(entry)
    records = entry.bench or {}
    cells = []
    for key, record in (records.get(image_id or "") or {}).items():
        date = RecordDate.parse(record.created) or context.dates.of(
            "builds", name, "bench", image_id or "", key
        )
        notes = _bench_notes(record)
        cell = StageCell("bench", "measured", "warn" if notes else "good", date, None, key, notes)
        cells.append(_aged(cell, context))
    if cells:
        return cells
    for other_id, by_key in records.items():
        for key, record in by_key.items():
            date = RecordDate.parse(record.created)
            note = f"for an older image ({short(other_id, 19)})"
            cells.append(StageCell("bench", "measured", "stale", date, None, key, (note,)))
    return cells or [StageCell("bench", "not run", "none")]


def _bench_notes(record: lockfile.BenchRecord) -> tuple[str, ...]:
    bursts = sum(c.burst_runs or 0 for c in record.cells)
    errors = sum(c.errors or 0 for c in record.cells)
    notes = []
    if bursts:
        notes.append(f"{_count(bursts, 'burst run')} (client decode rate discarded)")
    if errors:
        notes.append(_count(errors, "failed request"))
    return tuple(notes)


def _count(number: int, noun: str, plural: str | None = None) -> str:
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def _signed_note(signed: lockfile.SignedRecord | None) -> str:
    """The publication's signed and attested state, and its SBOM's size (docs/verify.md)."""
    if signed is None:
        return "not signed"
    kinds = ", ".join(sorted(signed.attestations)) or "nothing"
    packages = f"; SBOM: {_count(signed.sbom_packages, 'package')}" if signed.sbom_packages else ""
    return f"signed by {str(signed.key)[:19]}; attested: {kinds}{packages}"


def publish_cells(name: str, entry: lockfile.BuildEntry, context: Context) -> list[StageCell]:
    image_id = current_image(entry)
    cells = []
    for repository, record in (entry.publish or {}).items():
        date = context.dates.of("builds", name, "publish", repository)
        latest = record.history[-1] if record.history else None
        notes: list[str] = [f"{repository}:{record.tag}" if record.tag else repository]
        if record.image_id != image_id:
            notes.append("the pinned image is not published yet (this is an older one)")
            tone: Tone = "stale"
        elif latest is not None and latest.rolled_back:
            tone = "warn"
            notes.append("rolled back")
        elif record.verified is not True:
            tone = "warn"
            notes.append("published unverified (--force)")
        else:
            tone = "good"
        notes.append(_signed_note(record.signed))
        cells.append(
            StageCell("publish", "published", tone, date, record.verified, repository, tuple(notes))
        )
    return cells or [StageCell("publish", "not published", "none")]


@dataclass(frozen=True)
class BuildRow:
    name: str
    engine: str | None
    version: str | None
    cells: dict[str, list[StageCell]]

    @property
    def stands_out(self) -> bool:
        return any(c.stands_out for group in self.cells.values() for c in group)


def build_row(
    name: str, entry: lockfile.BuildEntry, profiles: Sequence[str], context: Context
) -> BuildRow:
    source = entry.source
    return BuildRow(
        name=name,
        engine=source.engine if source else None,
        version=source.version if source else None,
        cells={
            "source": [source_cell(name, entry, context)],
            "image": [image_cell(name, entry, context)],
            "preflight": [preflight_cell(name, entry, context)],
            "smoke": smoke_cells(name, entry, profiles, context)
            or [StageCell("smoke", "no profile", "none")],
            "bench": bench_cells(name, entry, context),
            "publish": publish_cells(name, entry, context),
        },
    )


# --- links --------------------------------------------------------------------------------

_WEB = re.compile(r"^https?://[^\s/@]+/[^\s?#]+\Z")


def web_base(repo: str | None) -> str | None:
    """The repository's web address, for links (http(s) only; ``.git`` dropped)."""
    if not repo:
        return None
    clean = strip_userinfo(repo).rstrip("/")
    if not _WEB.match(clean):
        return None
    return clean[: -len(".git")] if clean.endswith(".git") else clean


def pr_link(repo: str | None, number: int) -> str | None:
    base = web_base(repo)
    return f"{base}/pull/{number}" if base else None


def commit_link(repo: str | None, sha: str | None) -> str | None:
    base = web_base(repo)
    return f"{base}/commit/{sha}" if base and sha else None


def commit_links(cache_dir: Path) -> Callable[[str | None, str | None], str | None]:
    """:func:`commit_link`, except for a commit the cache shows came from a local mirror or
    repository (``--repo``): the mirror of ``repo`` lacks it and another mirror holds it, so
    the upstream's page of it may not exist."""
    mirrors = trusted_mirrors(cache_dir)  # git runs in none that is not the cache's own

    @functools.cache
    def elsewhere(repo: str, sha: str) -> bool:
        try:
            own = Mirror(cache_dir, repo)
        except SparkbuildError:
            return False
        if own.path in mirrors and own.has_commit(sha):
            return False
        return any(_holds(path, sha) for path in mirrors if path != own.path)

    def link(repo: str | None, sha: str | None) -> str | None:
        if repo and sha and elsewhere(repo, sha):
            return None
        return commit_link(repo, sha)

    return link


def _holds(git_dir: Path, sha: str) -> bool:
    args = ["cat-file", "-e", "--end-of-options", f"{sha}^{{commit}}"]
    done = git.run(args, git_dir=git_dir, check=False)
    return done.returncode == 0


def compare_link(repo: str | None, a: str | None, b: str | None) -> str | None:
    base = web_base(repo)
    return f"{base}/compare/{a}...{b}" if base and a and b and a != b else None


# --- the build page -----------------------------------------------------------------------


def patch_headline(project_dir: Path | None, file: str) -> str | None:
    """The first line of a patch file's header (what it fixes), None when unreadable."""
    if project_dir is None:
        return None
    try:
        path = validate.inside(project_dir, file, "patch file")
        # fileio: a FIFO or device left in a patch's place is refused, never waited on.
        head = fileio.read_bytes(path)[:4096].decode("utf-8", errors="replace")
    except (ValueError, OSError):
        return None
    for line in head.splitlines():
        if line.startswith(("diff --git", "--- ", "Index: ", "@@")):
            return "(no header)"
        if line.strip():
            return line.strip()
    return "(no header)"


def image_labels_of(name: str, entry: lockfile.BuildEntry) -> list[tuple[str, str]]:
    """The labels sparkbuild puts on the image, with the values the lock pins for them (the
    creation time is not locked, so it is not shown)."""
    source, image = entry.source, entry.image
    if image is None:
        return []
    pairs = [
        ("org.opencontainers.image.source", source.repo if source else None),
        ("org.opencontainers.image.revision", source.commit if source else None),
        ("org.opencontainers.image.version", source.version if source else None),
        ("org.opencontainers.image.base.name", image.base_image),
        ("org.opencontainers.image.base.digest", image.base_digest),
        (image_labels.TREE_LABEL, image.tree),
        (image_labels.BUILD_LABEL, name),
        (image_labels.INPUTS_LABEL, image.inputs_digest),
    ]
    return [(label, value) for label, value in pairs if value]


# Fields each record's table shows by name; any other field (a topology, say) is listed
# generically below it, so a record a newer stage writes is still shown whole.
SMOKE_SHOWN = frozenset(
    (
        "verdict",
        "checks",
        "accept_len",
        "boot_seconds",
        "engine",
        "engine_version",
        "served_version",
        "nan_signal",
        "target",
        "verified",
        "image_id",
        "numbers",
        "evidence",
        "declared",
    )
)
BENCH_SHOWN = frozenset(
    ("label", "created", "harness", "seed", "runs", "engine_args", "host", "cells")
)


def extra_fields(record: lockfile.SmokeRecord | lockfile.BenchRecord) -> dict[str, Any]:
    shown = (SMOKE_SHOWN if isinstance(record, lockfile.SmokeRecord) else BENCH_SHOWN) | {"hosts"}
    return {k: v for k, v in record.to_json().items() if k not in shown}


def obtained(record: lockfile.SmokeRecord, image_id: str) -> str:
    """How the verdict was obtained, in words."""
    kind, _, what = (record.target or "").partition(":")
    if kind in ("command", "url"):  # whatever the record says: nothing shows what ran
        return f"a {kind} run ({what}): nothing shows which image ran, so unverified"
    if record.image_verified(image_id):
        return f"a container of the image (id {short(record.image_id, 19)} read from it): verified"
    if record.verified and kind in ("image", "cluster"):
        return f"a container of another image ({short(record.image_id, 19)})"
    return "unknown: not verified"


@dataclass(frozen=True)
class SmokeView:
    profile: str
    image_id: str
    current: bool
    record: lockfile.SmokeRecord
    cell: StageCell
    how: str
    extras: dict[str, Any]


@dataclass(frozen=True)
class BenchView:
    key: str
    image_id: str
    current: bool
    record: lockfile.BenchRecord
    cells: list[CellFigures]
    charts: list[Chart]
    run: RunMatch | None
    flags: list[str]
    extras: dict[str, Any]


@dataclass(frozen=True)
class PreflightView:
    key: str
    run: lockfile.PreflightRun
    verdict: Status
    current: bool  # of the pinned image (in it) or of the locked tree
    date: RecordDate | None


@dataclass(frozen=True)
class BuildPage:
    name: str
    entry: lockfile.BuildEntry
    row: BuildRow
    headlines: dict[str, str | None]  # patch file -> its header's first line
    labels: list[tuple[str, str]]
    preflight: list[PreflightView]
    smoke: list[SmokeView]
    bench: list[BenchView]
    gate: dict[str, dict[str, str]] | None = None  # what publish would count, per profile
    runs_unrecorded: list[RunMatch] = field(default_factory=list)


def build_page(
    name: str,
    entry: lockfile.BuildEntry,
    row: BuildRow,
    runs: BenchRuns,
    context: Context,
    gate: dict[str, dict[str, str]] | None = None,
) -> BuildPage:
    image_id = current_image(entry) or ""
    source = entry.source
    patches = source.patches if source else []
    headlines = {p.file: patch_headline(context.project_dir, p.file) for p in patches}
    tree = source.tree if source else None
    preflight = [
        PreflightView(
            key,
            run,
            run_verdict(run),
            (run.where == "image" and run.image_id == image_id) or bool(tree and run.tree == tree),
            context.dates.of("builds", name, "preflight", key),
        )
        for key, run in (entry.preflight or {}).items()
    ]
    preflight.sort(key=lambda run: not run.current)
    smoke = [
        SmokeView(
            profile,
            other_id,
            other_id == image_id,
            record,
            _smoke_cell(name, other_id, profile, record, context),
            obtained(record, other_id),
            extra_fields(record),
        )
        for other_id, by_profile in _current_first(entry.smoke, image_id)
        for profile, record in by_profile.items()
    ]
    bench = [
        _bench_view(name, other_id, other_id == image_id, key, record, runs)
        for other_id, by_key in _current_first(entry.bench, image_id)
        for key, record in by_key.items()
    ]
    recorded = {id(view.run) for view in bench if view.run}
    unrecorded = [m for m in runs.for_build(name) if id(m) not in recorded]
    return BuildPage(
        name,
        entry,
        row,
        headlines,
        image_labels_of(name, entry),
        preflight,
        smoke,
        bench,
        gate,
        unrecorded,
    )


_Keyed = dict[str, dict[str, Any]]


def _current_first(records: _Keyed | None, image_id: str) -> list[tuple[str, dict[str, Any]]]:
    items = list((records or {}).items())
    return sorted(items, key=lambda item: item[0] != image_id)


def _bench_view(
    name: str, image_id: str, current: bool, key: str, record: lockfile.BenchRecord, runs: BenchRuns
) -> BenchView:
    match = runs.for_record(name, image_id, key)
    if match is not None:
        cells = [CellFigures.from_result(c) for c in match.run.report.cells]
        flags = [f"{c.key.label()}: {flag}" for c in match.run.report.cells for flag in c.flags]
    else:
        cells = [f for c in record.cells if (f := CellFigures.from_lock(c)) is not None]
        flags = [
            f"{c.label}: {_count(c.burst_runs, 'burst run')}; client decode rate not reported"
            for c in cells
            if c.burst_runs
        ]
    cells.sort(key=lambda c: (c.pp, c.tg, c.depth, c.concurrency))
    return BenchView(
        key,
        image_id,
        current,
        record,
        cells,
        bench_charts(cells),
        match,
        flags,
        extra_fields(record),
    )
