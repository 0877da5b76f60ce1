"""``sparkbuild report``: the static site made from images.lock and the recorded bench runs.

:func:`write_site` writes ``index.html`` (every build against every stage), a page per build
(``builds/NAME.html``), a page per build against its previous published image
(``diff/NAME--previous.html``) and ``report.json`` (what was written, for scripts); the
whole directory is swapped in at the end, so a failed run leaves the previous report as it
was. :func:`write_diff` writes one page comparing two ``BUILD@WHERE`` (see
:mod:`sparkbuild.report.sides`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import jinja2

from sparkbuild import fileio, lockfile
from sparkbuild.errors import ReportError
from sparkbuild.jsontext import Fields, JsonObject
from sparkbuild.preflight.gate import preflight_verdicts
from sparkbuild.publish.gate import declared_checks, smoke_verdicts
from sparkbuild.report import dates, diff, render, runs, sides, view
from sparkbuild.settings import Settings
from sparkbuild.spec import Build, load_builds

GENERATOR = "sparkbuild report"
MANIFEST = "report.json"
PageKind = Literal["index", "build", "previous", "diff"]


@dataclass(frozen=True)
class ReportOptions:
    out: Path
    bench_runs: tuple[Path, ...] = ()
    stale_days: float = 30.0
    attached: tuple[tuple[str, Path], ...] = ()  # (build, run JSON): `--attach BUILD=FILE`
    now: datetime | None = None  # the report's clock (ages of records); default: now


@dataclass(frozen=True)
class Page(Fields):
    kind: PageKind
    path: str  # relative to the report's directory
    build: str | None = None


@dataclass(frozen=True)
class ReportResult:
    out: Path
    pages: tuple[Page, ...]
    builds: int = 0
    bench_runs: runs.BenchRuns = field(default_factory=runs.BenchRuns)
    notes: tuple[str, ...] = ()

    @property
    def index(self) -> Path | None:
        first = next((p for p in self.pages if p.kind in ("index", "diff")), None)
        return self.out / first.path if first else None

    def to_json(self) -> JsonObject:
        return {
            "generator": GENERATOR,
            "out": str(self.out),
            "builds": self.builds,
            "pages": [page.to_json() for page in self.pages],
            "bench_runs": {
                "matched": [
                    {
                        "file": str(m.run.path),
                        "build": m.build,
                        "image_id": m.image_id,
                        "recorded": m.recorded,
                        "claims": len(m.claims.rows) if m.claims else 0,
                    }
                    for m in self.bench_runs.matched
                ],
                "unmatched": [{"file": str(p), "why": why} for p, why in self.bench_runs.unmatched],
            },
            "notes": list(self.notes),
        }


def _specs(settings: Settings) -> dict[str, Build]:
    """The builds of ``builds/`` (their smoke profiles are what publish asks for); none
    when the project has no ``builds/`` (a report made from a lock alone)."""
    return load_builds(settings) if settings.builds_dir.is_dir() else {}


def _gate(settings: Settings, spec: Build | None, entry: lockfile.BuildEntry) -> Any:
    image_id = view.current_image(entry)
    if spec is None or not image_id:
        return None
    return {
        "smoke": smoke_verdicts(entry, spec, image_id, (), declared_checks(settings, spec)),
        "preflight": preflight_verdicts(settings, spec, image_id, entry),
    }


def _load_lock(settings: Settings) -> tuple[lockfile.LockFile, dates.LockDates]:
    """The lock, and the dates of its records (read from the node tree it was loaded from)."""
    path = settings.lock_file
    lock, tree = lockfile.load_with_tree(path)
    if not lock.builds:
        raise ReportError(
            f"{path} has no builds to report on",
            "pin them first: sparkbuild lock (then build, preflight, smoke and publish)",
        )
    return lock, dates.tree_dates(path, tree)


def _page_name(text: str) -> str:
    """A file name for any ``BUILD@WHERE`` (build names are already safe)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "side"


#: The longest file name (in bytes) the file systems a report is written to hold.
NAME_MAX = 255


def page_file(folder: str, stem: str) -> str:
    """``folder/stem.html``, its file name at most ``NAME_MAX`` bytes: a longer one (two
    128-character build names side by side) keeps its start and ends in a digest of the
    whole, so two long names stay two pages."""
    name = f"{stem}.html"
    if len(name.encode()) > NAME_MAX:
        digest = hashlib.sha256(stem.encode()).hexdigest()[:16]
        keep = stem.encode()[: NAME_MAX - len(digest) - len("-.html")]
        name = f"{keep.decode(errors='ignore')}-{digest}.html"
    return f"{folder}/{name}"


def diff_page(a: str, b: str) -> str:
    """The page of ``BUILD@A`` against ``BUILD@B``."""
    return page_file("diff", f"{_page_name(a)}--{_page_name(b)}")


class _Writer:
    """Renders pages into a staging directory."""

    def __init__(self, staging: Path, common: Mapping[str, object], cache_dir: Path) -> None:
        self.staging = staging
        self.env = render.environment()
        # No link to the upstream's page of a commit that came from a local mirror (--repo).
        self.env.globals["commit_link"] = view.commit_links(cache_dir)
        self.common = common
        self.pages: list[Page] = []

    def write(self, written: Page, template: str, /, **values: object) -> None:
        root = "../" * written.path.count("/")
        try:
            text = self.env.get_template(template).render(**self.common, root=root, **values)
        except jinja2.TemplateError as exc:  # a sparkbuild bug: shown as one, not a trace
            raise RuntimeError(f"template {template}: {exc}") from exc
        target = self.staging / written.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        self.pages.append(written)


def _common(
    lock_path: Path, now: datetime, runs_read: int = 0, index: bool = True
) -> dict[str, object]:
    return {
        "has_index": index,
        "lock_name": lock_path.name,
        "generated": now.strftime("%Y-%m-%d %H:%M UTC"),
        "runs_read": runs_read,
    }


def check_out_dir(out: Path) -> None:
    """The report replaces ``out`` whole: only a previous report, or nothing, may be there."""
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {out} is a file", "pass a directory for the report")
    if out.is_dir() and any(out.iterdir()) and not _is_report(out):
        raise ReportError(
            f"--out {out} holds files that are not a sparkbuild report; the report replaces "
            "its directory whole",
            "pass an empty or new directory (default: .sparkbuild/report)",
        )


def _is_report(out: Path) -> bool:
    try:
        data = json.loads(fileio.read_text(out / MANIFEST))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("generator") == GENERATOR


def write_site(settings: Settings, options: ReportOptions) -> ReportResult:
    now = options.now or datetime.now(UTC)
    out = fileio.resolve_parent(options.out)
    check_out_dir(out)
    lock, lock_dates = _load_lock(settings)
    context = view.Context(lock_dates, now, options.stale_days, settings.project_dir)
    specs = _specs(settings)
    run_files, skipped = runs.read_runs(options.bench_runs)
    claims = runs.project_claims(settings) if run_files or options.attached else []
    bench_runs = runs.match_runs(lock, run_files, claims)
    attached = runs.attach_runs(lock, options.attached, claims)
    bench_runs = runs.BenchRuns((*bench_runs.matched, *attached), (*bench_runs.unmatched, *skipped))
    notes = [lock_dates.note] if lock_dates.note else []
    history = sides.LockHistory(settings.lock_file, lock)

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        writer = _Writer(
            staging, _common(settings.lock_file, now, len(run_files)), settings.cache_dir
        )
        rows, previous = [], {}
        for name, entry in lock.builds.items():
            spec = specs.get(name)
            profiles = spec.smoke_profiles if spec else ()
            row = view.build_row(name, entry, profiles, context)
            rows.append(row)
            page_diff = _previous_diff(name, entry, history, context, now)
            if page_diff is not None:
                previous[name] = page_file("diff", f"{name}--previous")
                writer.write(Page("previous", previous[name], name), "diff.html", diff=page_diff)
            page = view.build_page(
                name, entry, row, bench_runs, context, _gate(settings, spec, entry)
            )
            writer.write(
                Page("build", page_file("builds", name), name),
                "build.html",
                page=page,
                previous_page=previous.get(name),
            )
        writer.write(
            Page("index", "index.html"),
            "index.html",
            rows=rows,
            previous=previous,
            runs=bench_runs,
            notes=notes,
            stale_days=f"{options.stale_days:g}",
        )
        pages = [writer.pages[-1], *writer.pages[:-1]]  # the index first
        result = ReportResult(out, tuple(pages), len(rows), bench_runs, tuple(notes))
        (staging / MANIFEST).write_text(
            json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        fileio.replace_dir(staging, out)  # the previous report or this one, never neither
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return result


def _previous_diff(
    name: str,
    entry: lockfile.BuildEntry,
    history: sides.LockHistory,
    context: view.Context,
    now: datetime,
) -> diff.Diff | None:
    """The build as locked now against the newest published image that is not its own."""
    image_id = sides.previous_published(entry)
    if image_id is None:
        return None
    current = sides.Side(name, name, history.lock_path.name, entry)
    back = sides.published_images(entry).index(image_id)
    given = f"{name}@published" + (f"~{back}" if back else "")  # as --diff names it
    before = sides.side_for_image(given, name, image_id, history)
    return diff.diff_entries(before, current, _plain(context, now), context)


def _plain(context: view.Context, now: datetime) -> view.Context:
    """The context of a lock read from git: its dates are not this file's lines."""
    return view.Context(dates.no_dates("from git"), now, context.stale_days, None)


def write_diff(
    settings: Settings, given: Sequence[str], out: Path, now: datetime | None = None
) -> ReportResult:
    """One page: ``BUILD@A`` against ``BUILD@B``, at ``out/diff/A--B.html``."""
    now = now or datetime.now(UTC)
    lock, lock_dates = _load_lock(settings)
    history = sides.LockHistory(settings.lock_file, lock)
    a, b = (sides.resolve(g, history) for g in given)
    here = view.Context(lock_dates, now, 30.0, settings.project_dir)

    def context(side: sides.Side) -> view.Context:
        return _plain(here, now) if side.commit or side.note else here

    result = diff.diff_entries(a, b, context(a), context(b))
    out = fileio.resolve_parent(out)
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {out} is a file", "pass a directory for the report")
    page = Page("diff", diff_page(given[0], given[1]), b.build)
    try:  # into the directories named, never through a link planted in their place
        target = fileio.output_dir((out / page.path).parent) / Path(page.path).name
        staging = Path(tempfile.mkdtemp(prefix=".diff.", dir=fileio.output_dir(out)))
    except OSError as exc:
        raise ReportError(f"--out {out}: cannot write: {fileio.reason(exc)}") from exc
    try:
        writer = _Writer(staging, _common(settings.lock_file, now, index=False), settings.cache_dir)
        writer.write(page, "diff.html", diff=result)
        os.replace(staging / page.path, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ReportResult(out, (page,), 2)
