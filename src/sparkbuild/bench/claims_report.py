"""Holding a bench run against claims: per claimed figure, what the run measured in the same
cell, their ratio, and every setting in which the claim and the run differ.

A claim is about a run when it names the run's profile or model (or is chosen by setup name).
Its cell is found by pp, tg and depth (unpublished dimensions match anything); then:

* ``compared``: the run has the claim's concurrency; measured = median (min-max) over the
  runs of the matching cells, ratio = measured / claimed;
* ``not comparable``: the run measured that cell only at another concurrency, or measured
  no value for the figure (e.g. no drafts proposed): no ratio, and the reason says why;
* ``not reproduced``: the run has no such cell at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

from rich.console import Console
from rich.table import Table

from sparkbuild import fileio
from sparkbuild.bench.claims import METRICS, Figure, LoadedClaim, Setup
from sparkbuild.bench.report import number
from sparkbuild.bench.results import BenchReport, CellResult, RunFigures, Stat
from sparkbuild.console import show_table
from sparkbuild.errors import OutputError, UsageError
from sparkbuild.jsontext import Fields, JsonObject
from sparkbuild.redact import write_redacted

Status = Literal["compared", "not comparable", "not reproduced"]
DIMENSIONS = (("pp", "prompt tokens"), ("tg", "generated tokens"), ("depth", "context depth"))


@dataclass(frozen=True)
class ClaimRow:
    claim: LoadedClaim
    metric: str
    claimed: Figure
    status: Status
    measured: Stat | None = None
    ratio: float | None = None
    reason: str | None = None
    run_cells: list[str] = field(default_factory=list)

    def to_json(self) -> JsonObject:
        cell = self.claim.claim.cell
        return {
            "id": self.claim.id,
            "file": str(self.claim.file),
            "line": self.claim.line,
            "setup": self.claim.setup_name,
            "source": self.claim.source,
            "url": self.claim.url,
            "date": self.claim.date,
            "cell": {
                "pp": cell.pp,
                "tg": cell.tg,
                "depth": cell.depth,
                "concurrency": cell.concurrency,
            },
            "metric": self.metric,
            "claimed": list(self.claimed) if isinstance(self.claimed, tuple) else self.claimed,
            "measured": self.measured.model_dump() if self.measured else None,
            "ratio": self.ratio,
            "status": self.status,
            "reason": self.reason,
            "run_cells": self.run_cells,
            "unpublished": unpublished(self.claim),
        }


@dataclass(frozen=True)
class ClaimsComparison:
    report: BenchReport
    rows: list[ClaimRow]
    differences: dict[str, list[Difference]]  # setup name -> how the run differs from it
    other_claims: int  # claims about other models or profiles, left out

    def to_json(self) -> JsonObject:
        r = self.report
        return {
            "run": {
                "label": r.label,
                "created": r.created,
                "profile": r.profile,
                "engine": r.engine.name,
                "version": r.engine.version,
                "model": r.engine.model,
                "target": f"{r.target.kind} {r.target.value}",
                "complete": r.complete,
            },
            "rows": [row.to_json() for row in self.rows],
            "differences": {
                name: [d.to_json() for d in found] for name, found in self.differences.items()
            },
            "other_claims": self.other_claims,
        }


# --- matching ------------------------------------------------------------------------------


def _model_name(model: str) -> str:
    """Compare models by their last path part: a local copy of org/name is still name."""
    return PurePosixPath(model.rstrip("/")).name.lower()


def is_about(claim: LoadedClaim, report: BenchReport) -> bool:
    setup = claim.setup
    if setup.profile is not None and setup.profile == report.profile:
        return True
    run_models = {_model_name(report.engine.model), _model_name(report.engine.served_model)}
    return _model_name(setup.model) in run_models


def select_claims(
    claims: Sequence[LoadedClaim], report: BenchReport, setups: Sequence[str] = ()
) -> tuple[list[LoadedClaim], int]:
    """(claims about this run, how many were left out). ``setups`` chooses by setup name."""
    if setups:
        known = {c.setup_name for c in claims}
        unknown = [name for name in setups if name not in known]
        if unknown:
            raise UsageError(
                f"--claims-setup {', '.join(unknown)}: no such setup in the claims files",
                f"known setups: {', '.join(sorted(known))}",
            )
        chosen = [c for c in claims if c.setup_name in setups]
    else:
        chosen = [c for c in claims if is_about(c, report)]
    return chosen, len(claims) - len(chosen)


def _run_values(cell: CellResult, metric: str) -> list[float | None]:
    if metric == "accept_len":
        return [cell.accept_len]
    return [_run_value(run, metric) for run in cell.runs]


def _run_value(run: RunFigures, metric: str) -> float | None:
    if metric == "decode_tps":
        return run.decode_tps_aggregate
    if metric == "decode_tps_peak":  # the sum of per-request rates over successful requests
        ok = run.requests - run.errors
        return run.decode_tps_request * ok if run.decode_tps_request is not None else None
    if metric == "ttft_ms":
        return run.ttft_s * 1000.0 if run.ttft_s is not None else None
    value: float | None = getattr(run, metric)
    return value


def ratio_to(measured: float, claimed: Figure) -> float:
    """measured / claimed; for a published range, 1.0 inside it, else against the nearer end."""
    low, high = claimed if isinstance(claimed, tuple) else (claimed, claimed)
    if low <= measured <= high and low != high:
        return 1.0
    return float(f"{measured / (low if measured < low else high):.4g}")  # tiny ratios stay exact


def _cell_words(cells: Iterable[CellResult]) -> list[str]:
    return [c.key.label() for c in cells]


def topology_mismatch(setup: Setup, report: BenchReport) -> str | None:
    """Why a claim's figures cannot be held against this run's topology (None: they can).
    A TP=4 figure over four Sparks says nothing about one box, nor the reverse."""
    claimed = setup.topology
    if claimed is None:
        return None
    if report.topology is None:
        return f"the run's topology is unknown (no profile); the claim is {claimed.label()}"
    if not claimed.same_layout(report.topology):
        return f"topology differs: claim {claimed.label()}, run {report.topology.label()}"
    return None


def match_claim(claim: LoadedClaim, report: BenchReport) -> list[ClaimRow]:
    mismatch = topology_mismatch(claim.setup, report)
    if mismatch is not None:
        return [
            ClaimRow(claim, metric, claimed, "not comparable", reason=mismatch)
            for metric, claimed in claim.claim.figures().items()
        ]
    cell = claim.claim.cell
    same_shape = [
        c
        for c in report.cells
        if all(getattr(cell, d) in (None, getattr(c, d)) for d, _ in DIMENSIONS)
    ]
    rows: list[ClaimRow] = []
    for metric, claimed in claim.claim.figures().items():
        if not same_shape:
            rows.append(
                ClaimRow(claim, metric, claimed, "not reproduced", reason=_no_cell(claim, report))
            )
            continue
        cells = [c for c in same_shape if cell.concurrency in (None, c.concurrency)]
        if not cells:
            measured_at = _join(sorted({c.concurrency for c in same_shape}))
            reason = f"concurrency differs: claim c={cell.concurrency}, run c={measured_at}"
            rows.append(
                ClaimRow(
                    claim,
                    metric,
                    claimed,
                    "not comparable",
                    reason=reason,
                    run_cells=_cell_words(same_shape),
                )
            )
            continue
        rows.append(_compare(claim, metric, claimed, cells))
    return rows


def _compare(claim: LoadedClaim, metric: str, claimed: Figure, cells: list[CellResult]) -> ClaimRow:
    stat = Stat.of([v for c in cells for v in _run_values(c, metric)])
    words = _cell_words(cells)
    if stat.median is None:
        if metric == "accept_len":
            missing = "the run proposed no drafts in this cell (speculation off)"
        elif any(c.burst_runs for c in cells) and metric.startswith("decode"):
            missing = "every run arrived in a burst: no client decode rate to hold it against"
        else:
            missing = f"the run has no {METRICS[metric]} in this cell"
        return ClaimRow(claim, metric, claimed, "not comparable", reason=missing, run_cells=words)
    failed = sum(c.errors for c in cells)
    reason = f"{failed} of {sum(c.requests for c in cells)} requests failed" if failed else None
    return ClaimRow(
        claim, metric, claimed, "compared", stat, ratio_to(stat.median, claimed), reason, words
    )


def _no_cell(claim: LoadedClaim, report: BenchReport) -> str:
    cell = claim.claim.cell
    wanted = " ".join(
        f"{d}={getattr(cell, d)}" for d, _ in DIMENSIONS if getattr(cell, d) is not None
    )
    sweep = report.sweep
    have = f"pp={_join(sweep.pp)} tg={_join(sweep.tg)} depth={_join(sweep.depth)}"
    missing = "" if report.complete else " (the run is incomplete)"
    return f"the run has no cell {wanted}; it swept {have}{missing}"


def _join(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


# --- differences ---------------------------------------------------------------------------


def parse_flags(args: Sequence[str]) -> dict[str, str]:
    """``--name value`` / ``--name=value`` / bare ``--flag`` as {name: value}."""
    flags: dict[str, str] = {}
    index = 0
    while index < len(args):
        word = args[index]
        if word.startswith("-"):
            name, eq, value = word.partition("=")
            if not eq:
                following = args[index + 1] if index + 1 < len(args) else None
                if following is not None and not following.startswith("--"):
                    value = following
                    index += 1
                else:
                    value = "on"
            flags[name] = value
        index += 1
    return flags


def _same_value(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a == b
    try:
        return float(a) == float(b)  # 0.80 and 0.8 are one setting
    except ValueError:
        return a == b


@dataclass(frozen=True)
class Difference(Fields):
    """One setting in which a run differs from a claim's setup."""

    setting: str
    claim: str
    run: str

    def text(self) -> str:
        return f"{self.setting}: {self.claim} (claim) vs {self.run} (run)"


def _flag_words(flags: dict[str, str], names: Sequence[str]) -> str:
    words = [
        name if flags[name] == "on" else f"{name} {flags[name]}" for name in names if name in flags
    ]
    return " ".join(words) or "-"


def flag_difference(claimed: Sequence[str], run: Sequence[str]) -> Difference | None:
    """The flags set differently (or only on one side), each side as it sets them."""
    a, b = parse_flags(claimed), parse_flags(run)
    names = [n for n in [*a, *(n for n in b if n not in a)] if not _same_value(a.get(n), b.get(n))]
    if not names:
        return None
    return Difference("flags", _flag_words(a, names), _flag_words(b, names))


def _run_image(report: BenchReport) -> str:
    target = report.target
    if target.kind == "image":
        return target.value + (f" ({target.image_id[:19]})" if target.image_id else "")
    return "none (local command)" if target.kind == "command" else f"unknown ({target.kind})"


def setup_differences(setup: Setup, report: BenchReport) -> list[Difference]:
    """Every setting in which the run differs from a setup."""
    found: list[Difference] = []

    def note(setting: str, claimed: str | None, measured: str | None) -> None:
        if not _same_value(claimed, measured):
            found.append(Difference(setting, claimed or "not published", measured or "unknown"))

    engine = report.engine
    note("engine", setup.engine, engine.name)
    if setup.version is not None:
        note("engine version", setup.version, engine.version)
    note("image", setup.image, _run_image(report))
    if _model_name(setup.model) not in {
        _model_name(engine.model),
        _model_name(engine.served_model),
    }:
        note("model", setup.model, _display_model(engine.model))
    if setup.profile is not None:
        note("profile", setup.profile, report.profile)
    flags = flag_difference(setup.flags, engine.args) if setup.flags is not None else None
    if setup.flags is None:
        found.append(Difference("flags", "not published", " ".join(engine.args) or "-"))
    elif flags is not None:
        found.append(flags)
    note("harness", setup.harness, f"{report.harness.name} {report.harness.version}")
    prompts = report.prompts
    note("prompt set", setup.prompts, f"{prompts.recipe} seed {prompts.seed}" if prompts else None)
    host = report.host
    note("hardware", setup.hardware, f"{host.hostname} ({host.machine}, {host.cpus} cpus)")
    claimed, ran = setup.topology, report.topology
    if claimed is None or ran is None or not claimed.same_layout(ran):
        note("topology", claimed.label() if claimed else None, ran.label() if ran else None)
    return found


def unpublished(claim: LoadedClaim) -> list[str]:
    """The cell dimensions the source did not publish (they match any run value)."""
    cell = claim.claim.cell
    return [name for name in ("pp", "tg", "depth", "concurrency") if getattr(cell, name) is None]


def compare_claims(
    report: BenchReport, claims: Sequence[LoadedClaim], setups: Sequence[str] = ()
) -> ClaimsComparison:
    chosen, others = select_claims(claims, report, setups)
    rows = [row for claim in chosen for row in match_claim(claim, report)]
    by_setup: dict[str, list[LoadedClaim]] = {}
    for claim in chosen:
        by_setup.setdefault(claim.setup_name, []).append(claim)
    differences = {
        name: setup_differences(group[0].setup, report) for name, group in by_setup.items()
    }
    return ClaimsComparison(report, rows, differences, others)


# --- output --------------------------------------------------------------------------------


def figure_text(value: Figure, metric: str) -> str:
    """A claimed figure as it was published (no rounding, no padding)."""
    if isinstance(value, tuple):
        return f"{value[0]:g}-{value[1]:g}"
    return f"{value:g}"


def measured_text(row: ClaimRow) -> str:
    """``median (min-max)``, all three with the decimals the median's magnitude calls for."""
    stat = row.measured
    if stat is None or stat.median is None:
        return "-"
    digits = 2 if row.metric == "accept_len" else 0 if abs(stat.median) >= 100 else 1
    text = number(stat.median, digits)
    if stat.n > 1 and stat.min != stat.max:
        text += f" ({number(stat.min, digits)}-{number(stat.max, digits)})"
    return text


def ratio_text(row: ClaimRow) -> str:
    if row.ratio is None:
        return row.status
    if isinstance(row.claimed, tuple) and row.ratio == 1.0:
        return "within range"
    return f"{row.ratio:.2f}\N{MULTIPLICATION SIGN}"


def _display_model(model: str) -> str:
    """A local path shows as its last part (what the model is, not where it is cached)."""
    return PurePosixPath(model).name if model.startswith(("/", "./", "~")) else model


def _run_line(report: BenchReport) -> str:
    engine = report.engine
    return (
        f"{report.label}: {engine.name} {engine.version or ''} · {_display_model(engine.model)} · "
        f"{report.sweep.runs} runs/cell · {report.harness.name} {report.harness.version} · "
        f"{report.host.machine}, {report.host.cpus} cpus · {report.created}"
    )


def _differs(result: ClaimsComparison, row: ClaimRow) -> str:
    words = [d.setting for d in result.differences.get(row.claim.setup_name, [])]
    if row.status == "not comparable" and row.reason:
        words.insert(0, row.reason)
    elif row.status == "not reproduced":
        words.insert(0, "no such cell in the run")
    missing = unpublished(row.claim)
    if missing:
        words.append(f"{', '.join(missing)} not published")
    if row.reason and row.status == "compared":
        words.append(row.reason)
    return ", ".join(words) or "-"


def render(result: ClaimsComparison, console: Console) -> None:
    console.print("[bold]claims[/bold] against " + _run_line(result.report), highlight=False)
    rows = _tabled(result)
    if rows:
        show_table(console, _claims_table(result, rows))
    for line in _notes(result):
        console.print(line, markup=False, highlight=False)


def _claims_table(result: ClaimsComparison, rows: Sequence[ClaimRow]) -> Table:
    table = Table(header_style="bold", pad_edge=False)
    for title, justify in (
        ("claim", "left"),
        ("figure", "left"),
        ("claimed", "right"),
        ("measured (median, min-max)", "right"),
        ("ratio", "right"),
        ("differs", "left"),
    ):
        table.add_column(title, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(
            f"{row.claim.id}",
            METRICS[row.metric],
            figure_text(row.claimed, row.metric),
            measured_text(row),
            ratio_text(row),
            _differs(result, row),
            style=None if row.status == "compared" else "yellow",
        )
    return table


def _tabled(result: ClaimsComparison) -> list[ClaimRow]:
    """Rows the run has a cell for; claims with no cell go to the notes, one line each."""
    return [row for row in result.rows if row.status != "not reproduced"]


def _notes(result: ClaimsComparison) -> list[str]:
    """Under the table: the claims the run has no cell for, then each setup's differences.
    (A claim at another concurrency is a table row; its reason is in the differs column.)"""
    lines: list[str] = []
    missing: dict[str, list[ClaimRow]] = {}
    for row in result.rows:
        if row.status == "not reproduced":
            missing.setdefault(row.claim.id, []).append(row)
    if missing:
        sweep = result.report.sweep
        swept = (
            f"pp={_join(sweep.pp)} tg={_join(sweep.tg)} depth={_join(sweep.depth)} "
            f"c={_join(sweep.concurrency)}" + ("" if result.report.complete else ", incomplete")
        )
        lines.append(f"not reproduced (no such cell; the run swept {swept}):")
    for claim_id, rows in missing.items():
        figures = ", ".join(f"{METRICS[r.metric]} {figure_text(r.claimed, r.metric)}" for r in rows)
        lines.append(f"  - {claim_id}: {figures}")
    for name, found in result.differences.items():
        if found:
            lines.append(f"{name} differs from the run in:")
            lines.extend(f"  - {d.text()}" for d in found)
    if not result.rows:
        lines.append(
            "no claim is about this run (match by profile or model, or pass --claims-setup)"
        )
    if result.other_claims:
        lines.append(f"{result.other_claims} claims of other setups left out")
    return lines


def markdown(result: ClaimsComparison) -> str:
    """The comparison as a Markdown section, ready to paste into a forum post."""
    out = [
        f"### Published figures against {result.report.label}",
        "",
        f"Run: {_run_line(result.report)}",
        "",
    ]
    sources = {(r.claim.setup_name, r.claim.source, r.claim.date, r.claim.url) for r in result.rows}
    for name, source, date, url in sorted(sources, key=lambda s: s[0]):
        out.append(f"- {name}: {source} ({date})" + (f" <{url}>" if url else ""))
    if _tabled(result):
        out += [
            "",
            "| claim | figure | claimed | measured (median, min-max) | ratio | differs |",
            "|---|---|---:|---:|---:|---|",
        ]
    else:
        out += ["", "No published cell was measured in this run."]
    for row in _tabled(result):
        cells = [
            row.claim.id,
            METRICS[row.metric],
            figure_text(row.claimed, row.metric),
            measured_text(row),
            ratio_text(row),
            _differs(result, row),
        ]
        out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    notes = _notes(result)
    if notes:
        out += ["", *(line if line.startswith("  - ") else f"- {line}" for line in notes)]
    return "\n".join(out) + "\n"


def write_markdown(result: ClaimsComparison, path: Path, *, append: bool) -> None:
    text = markdown(result)
    if append and path.exists():
        try:
            text = fileio.read_text(path).rstrip("\n") + "\n\n" + text
        except (OSError, UnicodeDecodeError) as exc:
            why = fileio.reason(exc) if isinstance(exc, OSError) else "not UTF-8 text"
            raise OutputError(f"--markdown {path}: cannot append to it: {why}") from exc
    write_redacted(path, text, "--markdown")
