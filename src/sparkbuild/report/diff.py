"""What changed between two lock entries: the commit range, PRs added, dropped or turned
upstream, patches and wheels changed, the image's digests, and verdicts and figures side by
side."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from packaging.version import InvalidVersion, Version

from sparkbuild import lockfile
from sparkbuild.bench.report import delta_percent
from sparkbuild.report.charts import CellFigures
from sparkbuild.report.sides import Side
from sparkbuild.report.view import (
    Context,
    StageCell,
    build_row,
    compare_link,
    current_image,
)


@dataclass(frozen=True)
class Field:
    """One value on both sides."""

    name: str
    a: object
    b: object

    @property
    def changed(self) -> bool:
        return bool(self.a != self.b)


@dataclass(frozen=True)
class Change:
    """One item (a PR, patch, step or wheel) that differs, and how."""

    item: str
    how: tuple[str, ...]  # "added", "dropped", "turned upstream", "head moved", ...
    a: str | None  # the item on side A, in words (None: absent)
    b: str | None

    @property
    def kind(self) -> str:
        return self.how[0] if self.how else "changed"


@dataclass(frozen=True)
class VerdictRow:
    stage: str
    label: str | None
    a: StageCell | None
    b: StageCell | None

    @property
    def changed(self) -> bool:
        a, b = self.a, self.b
        return (a.verdict, a.tone) != (b.verdict, b.tone) if a and b else a is not b


@dataclass(frozen=True)
class FigureRow:
    profile: str
    cell: str
    figure: str
    a: float | None
    b: float | None

    @property
    def delta_pct(self) -> float | None:
        return delta_percent(self.a, self.b)


@dataclass(frozen=True)
class Diff:
    a: Side
    b: Side
    source: list[Field]
    commit_range: str | None  # a web link to the commits between, when the repo has one
    prs: list[Change]
    patches: list[Change]
    steps: list[Change]
    wheels: list[Change]
    image: list[Field]
    verdicts: list[VerdictRow]
    figures: list[FigureRow]


_Item = TypeVar("_Item")


def _changes(
    a: Iterable[_Item],
    b: Iterable[_Item],
    key: Callable[[_Item], str],
    words: Callable[[_Item], str],
    how: Callable[[_Item, _Item], list[str]],
) -> list[Change]:
    left = {key(item): item for item in a}
    right = {key(item): item for item in b}
    found: list[Change] = []
    for name in [*left, *(k for k in right if k not in left)]:
        x, y = left.get(name), right.get(name)
        if x is None and y is not None:
            found.append(Change(name, ("added",), None, words(y)))
        elif y is None and x is not None:
            found.append(Change(name, ("dropped",), words(x), None))
        elif x is not None and y is not None:
            kinds = how(x, y)
            if kinds:
                found.append(Change(name, tuple(kinds), words(x), words(y)))
    return found


def _pr_how(a: lockfile.LockedPR, b: lockfile.LockedPR) -> list[str]:
    kinds = []
    if a.status != b.status:
        kinds.append("turned upstream" if b.status == "upstream" else f"now {b.status}")
    if a.head != b.head:
        kinds.append("head moved")
    if a.when != b.when:
        kinds.append("range changed")
    if a.diff_sha256 and b.diff_sha256 and a.diff_sha256 != b.diff_sha256 and a.head == b.head:
        kinds.append("diff changed")
    return kinds


def _pr_words(pr: lockfile.LockedPR) -> str:
    return f"{pr.status} · head {(pr.head or '-')[:12]}" + (f" · when {pr.when}" if pr.when else "")


def _patch_how(a: lockfile.LockedPatch, b: lockfile.LockedPatch) -> list[str]:
    kinds = []
    if a.sha256 != b.sha256:
        kinds.append("content changed")
    if a.status != b.status:
        kinds.append(f"now {b.status}")
    if a.when != b.when:
        kinds.append("range changed")
    return kinds


def _patch_words(patch: lockfile.LockedPatch) -> str:
    return f"{patch.status} · sha256 {(patch.sha256 or '-')[:12]}" + (
        f" · when {patch.when}" if patch.when else ""
    )


def _step_how(a: lockfile.LockedStep, b: lockfile.LockedStep) -> list[str]:
    kinds = [f"now {b.status}"] if a.status != b.status else []
    if a.version != b.version:
        kinds.append("step code changed")
    return kinds


def _wheel_how(a: lockfile.LockedWheel, b: lockfile.LockedWheel) -> list[str]:
    if a.version != b.version:
        try:
            older = Version(b.version) < Version(a.version)
        except InvalidVersion:
            older = False
        return ["downgraded" if older else "bumped"]
    return ["rebuilt (same version, other file)"] if a.sha256 != b.sha256 else []


SOURCE_FIELDS = ("repo", "ref", "version", "commit", "tree", "spec_digest")
IMAGE_FIELDS = (
    "mode",
    "platform",
    "base_image",
    "base_digest",
    "image_id",
    "repo_digest",
    "inputs_digest",
    "tags",
)
FIGURES: tuple[tuple[str, Callable[[CellFigures], float | None]], ...] = (
    ("decode tok/s/req (client)", lambda c: c.decode_request),
    ("decode tok/s/req (engine)", lambda c: c.decode_engine),
    ("decode tok/s total", lambda c: c.decode_total),
    ("TTFT s", lambda c: c.ttft_s),
    ("accept len", lambda c: c.accept_len),
)


def _fields(names: Sequence[str], a: object, b: object) -> list[Field]:
    return [
        Field(n, getattr(a, n, None) if a else None, getattr(b, n, None) if b else None)
        for n in names
    ]


def _published(a: lockfile.BuildEntry, b: lockfile.BuildEntry) -> list[Field]:
    """The digest each repository's tags point at, on each side."""
    left, right = a.publish or {}, b.publish or {}
    return [
        Field(
            f"published to {repo}",
            left[repo].digest if repo in left else None,
            right[repo].digest if repo in right else None,
        )
        for repo in sorted({*left, *right})
    ]


def _verdicts(a: Side, b: Side, ca: Context, cb: Context) -> list[VerdictRow]:
    row_a = build_row(a.build, a.entry, (), ca)
    row_b = build_row(b.build, b.entry, (), cb)
    rows: list[VerdictRow] = []
    for stage in ("preflight", "smoke", "publish"):
        left = {c.label: c for c in row_a.cells[stage]}
        right = {c.label: c for c in row_b.cells[stage]}
        for label in [*left, *(k for k in right if k not in left)]:
            rows.append(VerdictRow(stage, label, left.get(label), right.get(label)))
    return rows


def _bench_cells(entry: lockfile.BuildEntry) -> dict[str, dict[str, CellFigures]]:
    records = (entry.bench or {}).get(current_image(entry) or "") or {}
    found: dict[str, dict[str, CellFigures]] = {}
    for key, record in records.items():
        cells = [f for c in record.cells if (f := CellFigures.from_lock(c)) is not None]
        found[key] = {c.label: c for c in cells}
    return found


def _figures(a: lockfile.BuildEntry, b: lockfile.BuildEntry) -> list[FigureRow]:
    left, right = _bench_cells(a), _bench_cells(b)
    rows: list[FigureRow] = []
    for profile in [k for k in left if k in right]:
        for label, x in left[profile].items():
            y = right[profile].get(label)
            if y is None:
                continue
            rows += [
                FigureRow(profile, label, name, get(x), get(y))
                for name, get in FIGURES
                if get(x) is not None or get(y) is not None
            ]
    return rows


def diff_entries(a: Side, b: Side, ca: Context, cb: Context) -> Diff:
    sa, sb = a.entry.source, b.entry.source
    repo = sb.repo if sb else None
    same_repo = sa is not None and sb is not None and sa.repo == sb.repo
    return Diff(
        a=a,
        b=b,
        source=_fields(SOURCE_FIELDS, sa, sb),
        commit_range=compare_link(repo, sa.commit, sb.commit) if same_repo and sa and sb else None,
        prs=_changes(
            sa.prs if sa else [], sb.prs if sb else [], lambda p: f"#{p.number}", _pr_words, _pr_how
        ),
        patches=_changes(
            sa.patches if sa else [],
            sb.patches if sb else [],
            lambda p: p.file,
            _patch_words,
            _patch_how,
        ),
        steps=_changes(
            sa.steps if sa else [],
            sb.steps if sb else [],
            lambda s: f"{s.step} {s.file}",
            lambda s: str(s.status),
            _step_how,
        ),
        wheels=_changes(
            a.entry.requirements or [],
            b.entry.requirements or [],
            lambda w: w.name,
            lambda w: f"{w.version} ({w.filename})",
            _wheel_how,
        ),
        image=[*_fields(IMAGE_FIELDS, a.entry.image, b.entry.image), *_published(a.entry, b.entry)],
        verdicts=_verdicts(a, b, ca, cb),
        figures=_figures(a.entry, b.entry),
    )
