"""Showing bench reports: Markdown, a terminal table, ``compare``, and the images.lock summary."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sparkbuild import fileio, jsontext, lockfile
from sparkbuild.bench.record import bench_record
from sparkbuild.bench.results import SCHEMA_VERSION, BenchReport, CellResult, HostInfo, Stat
from sparkbuild.bench.sweep import CellKey
from sparkbuild.console import show_table
from sparkbuild.engines.host_record import between, host_record
from sparkbuild.errors import UsageError


@dataclass(frozen=True)
class Column:
    title: str
    value: Callable[[CellResult], Stat | float | None]
    digits: int | None = None  # fixed decimals; None: by magnitude
    higher_is_better: bool = True


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


COLUMNS = (
    Column("TTFT s", lambda c: c.ttft_s, 3, higher_is_better=False),
    Column("TTFT p99 s", lambda c: c.ttft_p99_s, 3, higher_is_better=False),
    Column("prefill tok/s", lambda c: c.prefill_tps),
    Column("decode tok/s/req", lambda c: c.decode_tps_request),
    # The engine's own per-request rate (its histograms), beside the client's figure.
    Column("engine tok/s/req", lambda c: c.decode_tps_engine),
    Column("decode tok/s total", lambda c: c.decode_tps_aggregate),
    Column("ITL p50 ms", lambda c: _ms(c.itl_p50_s), 2, higher_is_better=False),
    Column("ITL p99 ms", lambda c: _ms(c.itl_p99_s), 2, higher_is_better=False),
    Column("accept len", lambda c: c.accept_len, 2),
)
CELL_HEADERS = ("pp", "tg", "depth", "conc")
# What fits a terminal; the Markdown and JSON outputs have every column.
TERMINAL_COLUMNS = tuple(
    c for c in COLUMNS if c.title not in ("TTFT p99 s", "ITL p50 ms", "ITL p99 ms")
)


def number(value: float | None, digits: int | None = None) -> str:
    if value is None:
        return "-"
    if digits is None:
        digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:.{digits}f}"


def show(value: Stat | float | None, digits: int | None) -> str:
    """``median (min-max)`` for a statistic over several runs, the number otherwise."""
    if not isinstance(value, Stat):
        return number(value, digits)
    if value.median is None:
        return "-"
    text = number(value.median, digits)
    if value.n > 1 and value.min != value.max:
        text += f" ({number(value.min, digits)}-{number(value.max, digits)})"
    return text


def central(value: Stat | float | None) -> float | None:
    return value.median if isinstance(value, Stat) else value


def _cell_words(cell: CellResult) -> list[str]:
    return [str(cell.pp), str(cell.tg), str(cell.depth), str(cell.concurrency)]


def _errors(cell: CellResult) -> str:
    return f"{cell.errors}/{cell.requests}" if cell.errors else "0"


def _bursts(cell: CellResult) -> str:
    return f"{cell.burst_runs}/{len(cell.runs)}" if cell.burst_runs else "0"


def _flag_lines(report: BenchReport) -> list[str]:
    lines = [f"{cell.key.label()}: {flag}" for cell in report.cells for flag in cell.flags]
    if not lines:
        return []
    return [
        "",
        "Flagged (a burst run reports the engine's rate only; see `bench` in docs/bench.md):",
        "",
        *(f"- {line}" for line in lines),
    ]


def _headline(report: BenchReport) -> list[str]:
    engine = report.engine
    target = report.target
    lines = [
        f"engine: {engine.name} {engine.version or ''}".rstrip() + f" · model {engine.model}",
        f"target: {target.kind} {target.value}"
        + (f" ({target.image_id[:19]})" if target.image_id else ""),
        f"profile: {report.profile or '-'} · args: {' '.join(engine.args) or '-'}",
        f"sweep: {report.sweep.runs} runs/cell · seed {report.sweep.seed} · "
        f"harness {report.harness.version} · host {report.host.hostname} "
        f"({report.host.cpus} cpus) · {report.created}",
    ]
    if not report.complete:
        lines.append(f"INCOMPLETE: {report.error}")
    return lines


def markdown(report: BenchReport) -> str:
    """The report as a Markdown section: a few facts, then one table row per cell."""
    out = [f"## Benchmark: {report.label}", ""]
    out += [f"- {line}" for line in _headline(report)]
    out += [
        "",
        "Values: median (min-max) over runs. Decode total: all streams of the cell together. "
        "Engine: the engine's own per-request rate. p50/p99: over all requests of the cell.",
        "",
    ]
    header = [*CELL_HEADERS, *(c.title for c in COLUMNS), "bursts", "errors"]
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "|".join("---:" for _ in header) + "|")
    for cell in report.cells:
        row = [*_cell_words(cell), *(show(c.value(cell), c.digits) for c in COLUMNS)]
        out.append("| " + " | ".join([*row, _bursts(cell), _errors(cell)]) + " |")
    out += _flag_lines(report)
    if report.pending_cells:
        out += ["", "Not measured (the sweep stopped): " + "; ".join(report.pending_cells)]
    return "\n".join(out) + "\n"


def render(report: BenchReport, console: Console) -> None:
    """A terminal summary: medians only (the Markdown and JSON outputs have min and max)."""
    console.print(f"[bold]bench[/bold] {escape(report.label)}", highlight=False)
    for line in _headline(report):
        console.print(line, markup=False, highlight=False)
    table = Table(
        show_header=True, header_style="bold", pad_edge=False, caption="medians over runs"
    )
    for title in (*CELL_HEADERS, *(c.title for c in TERMINAL_COLUMNS), "bursts", "errors"):
        table.add_column(title, justify="right")
    for cell in report.cells:
        shown = (number(central(c.value(cell)), c.digits) for c in TERMINAL_COLUMNS)
        row = [*_cell_words(cell), *shown]
        flagged = cell.errors or cell.flags
        table.add_row(
            *row, Text(_bursts(cell)), Text(_errors(cell)), style="red" if flagged else None
        )
    show_table(console, table)
    for line in _flag_lines(report)[3:]:
        console.print(line, markup=False, highlight=False, style="yellow")


def load_report(path: Path) -> BenchReport:
    """A sparkbuild ``bench --json`` report, or a llama-benchy ``--format json`` or CSV one."""
    from sparkbuild.bench import llama_benchy

    try:
        text = fileio.read_bytes(path).decode("utf-8")
        if llama_benchy.is_csv(text):
            return llama_benchy.csv_to_report(text, path)
        data = jsontext.loads(text)  # no NaN or Infinity figures
        field = jsontext.nonfinite_field(data)  # nor one too large to be finite (1e999)
        if field is not None:
            raise ValueError(f"{field} is not a finite number")
        if llama_benchy.is_llama_benchy(data):
            return llama_benchy.to_report(data, path)
        version = data.get("schema_version") if isinstance(data, dict) else None
        if isinstance(data, dict) and version != SCHEMA_VERSION:
            raise UsageError(
                f"{path}: bench report schema_version {version!r}; this sparkbuild reads "
                f"schema_version {SCHEMA_VERSION} only, so it is not compared",
                "compare reports written by the same sparkbuild release (run the bench again)",
            )
        return BenchReport.model_validate(data)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {fileio.reason(exc)}") from None
    except (ValueError, ValidationError, RecursionError) as exc:
        first = str(exc).splitlines()[0:3]
        raise UsageError(
            f"{path} is not a sparkbuild bench report or a llama-benchy 0.4 JSON or CSV: "
            f"{' '.join(first)}",
            "write one with `sparkbuild bench ... --json-file FILE` "
            "(or `llama-benchy --format json` or `--format csv`)",
        ) from None


# --- compare -----------------------------------------------------------------------------


def _differences(a: BenchReport, b: BenchReport) -> dict[str, str]:
    """Every way the two runs differ, keyed by dimension, with a short description."""
    found: dict[str, str] = {}

    def note(name: str, left: object, right: object) -> None:
        if left != right:
            found[name] = f"{left!s} vs {right!s}"

    note("engine build", _build_id(a), _build_id(b))
    if a.engine.args != b.engine.args:
        found["engine arguments"] = argument_changes(a.engine.args, b.engine.args)
    if a.engine.env != b.engine.env:
        found["engine environment"] = setting_changes(a.engine.env, b.engine.env)
    note("model", a.engine.model, b.engine.model)
    note("engine", a.engine.name, b.engine.name)
    note("harness version", a.harness.version, b.harness.version)
    pa, pb = a.prompts, b.prompts
    note("prompt recipe", pa and pa.recipe, pb and pb.recipe)
    note("prompt seed", a.sweep.seed, b.sweep.seed)
    if "prompt seed" not in found and "model" not in found:
        note("prompts", pa and pa.fingerprint[:12], pb and pb.fingerprint[:12])
    cells_a = {c.key for c in a.cells}
    cells_b = {c.key for c in b.cells}
    if cells_a != cells_b:
        found["cells"] = f"{len(cells_a - cells_b)} only in A, {len(cells_b - cells_a)} only in B"
    note("runs per cell", a.sweep.runs, b.sweep.runs)
    note("warm-up", a.sweep.warmup, b.sweep.warmup)
    note("prefix caching", a.sweep.prefix_caching, b.sweep.prefix_caching)
    return found


def _arg_settings(args: Sequence[str]) -> dict[str, str]:
    """Engine arguments as settings: ``--flag value`` pairs, bare flags, and the keys of a
    JSON object value (``--speculative-config {...}``) each on their own."""
    settings: dict[str, str] = {}
    words = list(args)
    position = 0
    while position < len(words):
        word = words[position]
        position += 1
        if not word.startswith("-"):
            settings[f"argument {position}"] = word
            continue
        flag, equals, value = word.partition("=")
        if not equals:
            takes_value = position < len(words) and not words[position].startswith("--")
            value = words[position] if takes_value else "on"
            position += int(takes_value)
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and parsed:
            for key, item in parsed.items():
                name = key if key not in settings else f"{flag}.{key}"
                settings[name] = json.dumps(item) if not isinstance(item, str) else item
        else:
            settings[flag] = value
    return settings


def argument_changes(a: Sequence[str], b: Sequence[str]) -> str:
    """What changed between two engine argument lists, setting by setting:
    ``num_speculative_tokens 3 → 1``, not both full command lines."""
    return setting_changes(_arg_settings(a), _arg_settings(b))


def setting_changes(left: Mapping[str, str], right: Mapping[str, str]) -> str:
    """``NAME a → b`` for each setting that differs (``(unset)`` on the side that lacks it):
    a diff to read, never two dictionaries printed side by side."""
    changes = [
        f"{name} {left.get(name, '(unset)')} → {right.get(name, '(unset)')}"
        for name in dict.fromkeys([*left, *right])
        if left.get(name) != right.get(name)
    ]
    return "; ".join(changes) or "the same settings in another order"


def _build_id(report: BenchReport) -> str:
    """The engine build: the image id, else the version the server reports (a URL or a
    command line differs by port from run to run, so neither identifies a build)."""
    if report.target.image_id:
        return report.target.image_id
    return f"{report.engine.name} {report.engine.version or '(unknown version)'}"


# What a comparison is meant to vary: one of these differing is the subject, not a caveat.
SUBJECTS = ("engine build", "engine arguments", "engine environment", "model", "engine")


#: Per-core load (the busier of start and end, 1-minute) that two runs may differ by before
#: their host's load is named as a difference: half of every core busy with other work.
LOAD_GAP = 0.5


def _host_words(host: HostInfo) -> str:
    parts = [host.hostname, host.cpu_model or "CPU model not recorded"]
    parts.append(f"{host.cpus} cpus" if host.cpus else "cpus not recorded")
    if host.memory_gib is not None:
        parts.append(f"{host.memory_gib:g} GiB")
    return ", ".join(parts)


def _hardware(host: HostInfo) -> tuple[object, ...]:
    return (host.cpu_model, host.cpus, host.machine, host.memory_gib)


def host_warnings(a: BenchReport, b: BenchReport) -> list[str]:
    """What the two hosts make of the percentages: other machines, or the same machine under
    another load. Printed before any percentage."""
    warnings = []
    ha, hb = a.host, b.host
    same = _hardware(ha) == _hardware(hb)
    if not same or ha.hostname != hb.hostname:
        warnings.append(
            f"the runs come from different hosts: A {_host_words(ha)}; B {_host_words(hb)}. "
            "The percentages measure the machines as much as the settings"
        )
    loads = {"A": ha.load_per_core(), "B": hb.load_per_core()}
    unknown = [label for label, load in loads.items() if load is None]
    for label in unknown:
        warnings.append(
            f"{label} does not record its host's load average (a report made before "
            "sparkbuild recorded it, or another harness's): how busy that host was is unknown"
        )
    warnings += between(host_record(a.host_facts), host_record(b.host_facts))
    la, lb = loads["A"], loads["B"]
    if la is not None and lb is not None and abs(la - lb) >= LOAD_GAP:
        warnings.append(
            f"the hosts' load differs: A {la:g}, B {lb:g} per core (1-minute load average, "
            "the busier of the run's start and end): a busy host serves and measures slower"
        )
    return warnings


def compare_warnings(a: BenchReport, b: BenchReport) -> tuple[str | None, list[str]]:
    """(what is compared, warnings about everything else that differs)."""
    found = _differences(a, b)
    subjects = [name for name in SUBJECTS if name in found]
    warnings = host_warnings(a, b)
    warnings += [f"{name} differs: {found[name]}" for name in found if name not in SUBJECTS]
    if len(subjects) > 1:
        warnings.insert(
            0,
            "the runs differ in several engine settings at once ("
            + ", ".join(f"{s}: {found[s]}" for s in subjects)
            + "); the deltas mix their effects",
        )
    for label, report in (("A", a), ("B", b)):
        if report.harness.name == "llama-benchy":
            warnings.append(
                f"{label} is a llama-benchy {report.harness.version} report: means over runs "
                "(not medians), chat completions, and decode rates from chunk arrival with no "
                "engine cross-check"
            )
        bursts = sum(c.burst_runs for c in report.cells)
        if bursts:
            warnings.append(f"{label} has {bursts} burst runs (client decode rate discarded)")
        if not report.complete:
            warnings.append(f"{label} is incomplete: {report.error}")
        if report.prompts is not None and not report.prompts.exact:
            warnings.append(f"{label}: some prompts missed their token length")
        failed = sum(c.errors for c in report.cells)
        if failed:
            warnings.append(f"{label} has {failed} failed requests")
    subject = f"{subjects[0]}: {found[subjects[0]]}" if len(subjects) == 1 else None
    return subject, warnings


def delta_percent(a: float | None, b: float | None, digits: int | None = None) -> float | None:
    """B against A in percent of A; None when either is missing or A is ~0 (see
    :func:`near_zero`): a percentage over nothing is noise, "+111036.4 %"."""
    if a is None or b is None or near_zero(a, digits):
        return None
    return round((b - a) / abs(a) * 100.0, 2)


def near_zero(value: float | None, digits: int | None = None) -> bool:
    """Whether ``value`` shows as zero at its column's precision (0.0004 ms is "0.00")."""
    return value is not None and float(number(value, digits)) == 0.0


NEAR_ZERO_TEXT = "n/a (baseline ~0)"


def compare_rows(a: BenchReport, b: BenchReport) -> list[dict[str, object]]:
    """Cells present in both, each with A, B and Δ% per column (medians)."""
    rows: list[dict[str, object]] = []
    firsts: tuple[dict[CellKey, CellResult], dict[CellKey, CellResult]] = ({}, {})
    for report, first in zip((a, b), firsts, strict=True):  # one look-up per cell: linear
        for cell in report.cells:
            first.setdefault(cell.key, cell)
    for key in (cell.key for cell in a.cells):
        left, right = firsts[0][key], firsts[1].get(key)
        if right is None:
            continue
        row: dict[str, object] = {
            "pp": key.pp,
            "tg": key.tg,
            "depth": key.depth,
            "concurrency": key.concurrency,
        }
        for column in COLUMNS:
            va, vb = central(column.value(left)), central(column.value(right))
            row[column.title] = {
                "a": va,
                "b": vb,
                "delta_pct": delta_percent(va, vb, column.digits),
                "baseline_near_zero": near_zero(va, column.digits) and vb is not None,
            }
        rows.append(row)
    return rows


def _delta_text(cell: dict[str, Any], column: Column) -> str:
    a, b, delta = cell["a"], cell["b"], cell["delta_pct"]
    text = f"{number(a, column.digits)} → {number(b, column.digits)}"
    if cell.get("baseline_near_zero"):
        return f"{text} [dim]({NEAR_ZERO_TEXT})[/dim]"
    if delta is None:
        return text
    better = (delta > 0) == column.higher_is_better
    style = "green" if better and abs(delta) >= 1 else "red" if abs(delta) >= 1 else "dim"
    return f"{text} [{style}]({delta:+.1f}%)[/{style}]"


def _load_text(load: list[float] | None) -> str:
    return "not recorded" if not load else " / ".join(f"{value:g}" for value in load)


def host_rows(a: BenchReport, b: BenchReport) -> list[tuple[str, str, str]]:
    """(fact, A, B) for the two hosts, as compare shows them side by side."""

    def facts(host: HostInfo) -> list[str]:
        per_core = host.load_per_core()
        return [
            host.hostname,
            host.cpu_model or "not recorded",
            str(host.cpus) if host.cpus else "not recorded",
            f"{host.memory_gib:g} GiB" if host.memory_gib is not None else "not recorded",
            _load_text(host.load_start),
            _load_text(host.load_end),
            f"{per_core:g}" if per_core is not None else "not recorded",
        ]

    names = ["host", "CPU", "cores", "memory", "load at start (1/5/15 min)", "load at end"]
    names.append("load per core")
    return list(zip(names, facts(a.host), facts(b.host), strict=True))


def render_hosts(a: BenchReport, b: BenchReport, console: Console) -> None:
    """The two hosts side by side, before any percentage."""
    table = Table(title="hosts", header_style="bold", pad_edge=False)
    for title in ("", "A", "B"):
        table.add_column(title)
    for name, left, right in host_rows(a, b):
        style = "yellow" if left != right else ""
        table.add_row(Text(name), Text(left, style=style), Text(right, style=style))
    show_table(console, table)


def render_compare(
    rows: Sequence[dict[str, Any]], label_a: str, label_b: str, console: Console
) -> None:
    table = Table(
        title=f"A = {escape(label_a)}   B = {escape(label_b)}   (medians, A → B, Δ% of A)",
        header_style="bold",
        pad_edge=False,
    )
    for title in (*CELL_HEADERS, *(c.title for c in TERMINAL_COLUMNS)):
        table.add_column(title, justify="right")
    for row in rows:
        words = [str(row[k]) for k in ("pp", "tg", "depth", "concurrency")]
        table.add_row(*words, *(_delta_text(row[c.title], c) for c in TERMINAL_COLUMNS))
    show_table(console, table)


def markdown_compare(
    rows: Sequence[dict[str, Any]],
    label_a: str,
    label_b: str,
    hosts: Sequence[tuple[str, str, str]] = (),
) -> str:
    out = [f"## Benchmark comparison: A = {label_a}, B = {label_b}", ""]
    if hosts:
        out += ["| host | A | B |", "|---|---|---|"]
        out += [f"| {name} | {left} | {right} |" for name, left, right in hosts]
        out.append("")
    header = [*CELL_HEADERS, *(c.title for c in COLUMNS)]
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "|".join("---:" for _ in header) + "|")
    for row in rows:
        words = [str(row[k]) for k in ("pp", "tg", "depth", "concurrency")]
        values = []
        for column in COLUMNS:
            cell = row[column.title]
            delta = cell["delta_pct"]
            text = f"{number(cell['a'], column.digits)} → {number(cell['b'], column.digits)}"
            if cell.get("baseline_near_zero"):
                text += f" ({NEAR_ZERO_TEXT})"
            elif delta is not None:
                text += f" ({delta:+.1f}%)"
            values.append(text)
        out.append("| " + " | ".join([*words, *values]) + " |")
    return "\n".join(out) + "\n"


# --- images.lock -------------------------------------------------------------------------


def record(lock_path: Path, build: str, report: BenchReport) -> str:
    """Store the summary under ``builds.<build>.bench.<image_id>.<profile>``."""
    made, tested_id = bench_record(report), report.target.image_id
    if report.target.launcher == "lws" and tested_id:  # Kubernetes: the pods ran a digest
        image_id = lockfile.digest_image_id(lock_path, build, tested_id)
        made = made.model_copy(update={"nodes": lockfile.nodes_as(made.nodes, tested_id, image_id)})
        tested_id = image_id
    return lockfile.record_for_image(
        lock_path,
        build,
        report.profile or report.label,
        made,
        tested_id=tested_id,
        activity="benchmark",
    )
