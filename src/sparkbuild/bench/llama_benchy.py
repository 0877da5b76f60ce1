"""llama-benchy 0.4 compatibility: read its ``--format json``, write its CSV and Markdown.

DGX Spark posts publish llama-benchy tables. Formats as llama-benchy 0.4.0 writes them
(``llama_benchy/results.py``):

* JSON: run metadata (``version``, ``timestamp``, ``model``, ``latency_mode``, ...) and
  ``benchmarks[]``, each with ``concurrency``, ``context_size``, ``prompt_size``,
  ``response_size``, ``is_context_prefill_phase`` and ``{mean, std, values}`` for
  ``pp_throughput``, ``pp_req_throughput``, ``tg_throughput``, ``tg_req_throughput``,
  ``peak_throughput``, ``peak_req_throughput``, ``ttfr``, ``est_ppt``, ``e2e_ttft`` (times
  in ms). ``*_throughput`` is the batch total when concurrency > 1, per request otherwise.
* Rows: one ``pp{N}`` and one ``tg{N}`` row per run, `` @ d{depth}`` when there is context,
  `` (c{N})`` when the suite's highest concurrency is above 1.
* CSV columns: ``model, test_name, t_s_mean, t_s_std, t_s_req_mean, ..., e2e_ttft_std``.
* Markdown: ``model | test | t/s (total) | t/s (req) | peak t/s | peak t/s (req) |
  ttfr (ms) | est_ppt (ms) | e2e_ttft (ms)`` (``t/s`` and no per-request columns at c=1),
  cells ``mean ± std`` with two decimals.

sparkbuild's exports keep those columns in that order and append its own (the engine's rate,
bursts, percentiles). It does not measure ``ttfr``/``est_ppt``/peaks: those stay empty.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import re
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sparkbuild.bench.results import (
    BenchReport,
    CellResult,
    EngineInfo,
    HarnessInfo,
    HostInfo,
    RunFigures,
    Stat,
    TargetInfo,
)
from sparkbuild.bench.sweep import Sweep

CSV_COLUMNS = (
    "model",
    "test_name",
    "t_s_mean",
    "t_s_std",
    "t_s_req_mean",
    "t_s_req_std",
    "peak_ts_mean",
    "peak_ts_std",
    "peak_ts_req_mean",
    "peak_ts_req_std",
    "ttfr_mean",
    "ttfr_std",
    "est_ppt_mean",
    "est_ppt_std",
    "e2e_ttft_mean",
    "e2e_ttft_std",
)
SPARKBUILD_CSV_COLUMNS = (
    "engine_t_s_req_mean",
    "engine_t_s_req_std",
    "burst_runs",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "flags",
)
MD_HEADERS = (
    "model",
    "test",
    "t/s (total)",
    "t/s (req)",
    "peak t/s",
    "peak t/s (req)",
    "ttfr (ms)",
    "est_ppt (ms)",
    "e2e_ttft (ms)",
)
MD_HEADERS_C1 = ("model", "test", "t/s", "peak t/s", "ttfr (ms)", "est_ppt (ms)", "e2e_ttft (ms)")
SPARKBUILD_MD_HEADERS = ("engine t/s (req)", "bursts")


# --- reading ----------------------------------------------------------------------------


class _Metric(BaseModel):
    model_config = ConfigDict(extra="ignore")
    mean: float
    std: float = 0.0
    values: list[float] = []


class _Run(BaseModel):
    model_config = ConfigDict(extra="ignore")  # time series and later additions
    concurrency: int = Field(ge=1)
    context_size: int = Field(ge=0)
    prompt_size: int = Field(ge=0)
    response_size: int = Field(ge=0)
    is_context_prefill_phase: bool = False
    pp_throughput: _Metric | None = None
    pp_req_throughput: _Metric | None = None
    tg_throughput: _Metric | None = None
    tg_req_throughput: _Metric | None = None
    e2e_ttft: _Metric | None = None


class _Report(BaseModel):
    model_config = ConfigDict(extra="ignore")
    version: str = "unknown"
    timestamp: str = ""
    model: str = "unknown"
    latency_mode: str | None = None
    prefix_caching_enabled: bool = False  # its --enable-prefix-caching (context loads first)
    benchmarks: list[_Run]


def is_llama_benchy(data: object) -> bool:
    """A llama-benchy JSON: ``benchmarks[]`` at the top, no sparkbuild ``schema_version``."""
    return isinstance(data, dict) and "benchmarks" in data and "schema_version" not in data


def _stat(metric: _Metric | None, scale: float = 1.0) -> Stat:
    """llama-benchy gives mean ± std: the mean stands where sparkbuild puts its median."""
    if metric is None:
        return Stat()
    values = [v * scale for v in metric.values] or [metric.mean * scale]
    return Stat(
        median=round(metric.mean * scale, 4),
        min=round(min(values), 4),
        max=round(max(values), 4),
        n=len(values),
    )


def _cell(run: _Run) -> CellResult:
    per_request = run.tg_req_throughput or run.tg_throughput
    return CellResult(
        pp=run.prompt_size,
        tg=run.response_size,
        depth=run.context_size,
        concurrency=run.concurrency,
        ttft_s=_stat(run.e2e_ttft, 0.001),  # llama-benchy times are in ms
        prefill_tps=_stat(run.pp_req_throughput or run.pp_throughput),
        prefill_tps_aggregate=_stat(run.pp_throughput),
        decode_tps_request=_stat(per_request),
        decode_tps_aggregate=_stat(run.tg_throughput),
        output_tps=Stat(),
        accept_len=None,
        prompt_tokens_target=run.context_size + run.prompt_size,
        prompt_tokens=None,
        completion_tokens=None,
        requests=0,
        errors=0,
        runs=[],
    )


def to_report(data: Mapping[str, object], path: Path) -> BenchReport:
    """A llama-benchy JSON as a (client-side only) sparkbuild report, for ``bench compare``.
    Raises ValueError/ValidationError on a file that does not have the 0.4 shape."""
    parsed = _Report.model_validate(data)
    runs = [r for r in parsed.benchmarks if not r.is_context_prefill_phase]
    if not runs:
        raise ValueError("no benchmark runs (only context-prefill phases, or none at all)")
    cells = [_cell(r) for r in runs]
    repeats = max(
        (len((r.tg_throughput or r.pp_throughput or _Metric(mean=0)).values) for r in runs),
        default=1,
    )
    return BenchReport(
        created=parsed.timestamp,
        label=f"llama-benchy {parsed.version} · {parsed.model} ({path.name})",
        profile=None,
        harness=HarnessInfo(
            name="llama-benchy", version=parsed.version, sparkbuild="-", http_client="aiohttp"
        ),
        host=HostInfo(hostname="(not recorded)", platform="", machine="", cpus=None, python=""),
        target=TargetInfo(kind="url", value="(not recorded by llama-benchy)"),
        engine=EngineInfo(name="(not recorded)", model=parsed.model, served_model=parsed.model),
        sweep=Sweep(
            pp=sorted({c.pp for c in cells}),
            tg=sorted({c.tg for c in cells}),
            depth=sorted({c.depth for c in cells}),
            concurrency=sorted({c.concurrency for c in cells}),
            runs=max(repeats, 1),
            prefix_caching=parsed.prefix_caching_enabled,
        ),
        complete=True,
        cells=cells,
    )


# --- writing ----------------------------------------------------------------------------


def _mean_std(values: Sequence[float | None]) -> tuple[float, float] | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return statistics.fmean(present), statistics.pstdev(present)  # numpy's std: ddof 0


def _over_runs(
    cell: CellResult, pick: Callable[[RunFigures], float | None], scale: float = 1.0
) -> tuple[float, float] | None:
    return _mean_std([None if (v := pick(run)) is None else v * scale for run in cell.runs])


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1000:.3f}"


def rows(report: BenchReport) -> list[dict[str, Any]]:
    """llama-benchy's rows (pp then tg per cell) with sparkbuild's extras; each value is a
    ``(mean, std)`` pair or None."""
    multi = max(report.sweep.concurrency, default=1) > 1
    model = report.engine.served_model or report.engine.model
    out: list[dict[str, object]] = []
    for cell in report.cells:
        depth = f" @ d{cell.depth}" if cell.depth > 0 else ""
        conc = f" (c{cell.concurrency})" if multi else ""
        batch = cell.concurrency > 1
        out.append(
            {
                "model": model,
                "test_name": f"pp{cell.pp}{depth}{conc}",
                "t_s": _over_runs(
                    cell,
                    (lambda r: r.prefill_tps_aggregate) if batch else (lambda r: r.prefill_tps),
                ),
                "t_s_req": _over_runs(cell, lambda r: r.prefill_tps),
                "e2e_ttft": _over_runs(cell, lambda r: r.ttft_s, 1000.0),
                "ttft_p50_ms": _ms(cell.ttft_p50_s),
                "ttft_p99_ms": _ms(cell.ttft_p99_s),
                "cell": cell,
            }
        )
        out.append(
            {
                "model": model,
                "test_name": f"tg{cell.tg}{depth}{conc}",
                "t_s": _over_runs(
                    cell,
                    (lambda r: r.decode_tps_aggregate)
                    if batch
                    else (lambda r: r.decode_tps_request),
                ),
                "t_s_req": _over_runs(cell, lambda r: r.decode_tps_request),
                "engine_t_s_req": _over_runs(cell, lambda r: r.decode_tps_engine),
                "burst_runs": str(cell.burst_runs),
                "itl_p50_ms": _ms(cell.itl_p50_s),
                "itl_p99_ms": _ms(cell.itl_p99_s),
                "flags": "; ".join(cell.flags),
                "cell": cell,
            }
        )
    return out


def _split(pair: tuple[float, float] | None) -> tuple[str, str]:
    return ("", "") if pair is None else (f"{pair[0]:.4f}", f"{pair[1]:.4f}")


def as_text(cell: str) -> str:
    """A text cell a spreadsheet would run as a formula (``=``, ``+``, ``-``, ``@``, a tab or
    a carriage return first: an engine's model name) written as text, with a leading ``'``."""
    return "'" + cell if cell[:1] in ("=", "+", "-", "@", "\t", "\r") else cell


def to_csv(report: BenchReport) -> str:
    """llama-benchy's CSV columns, in its order, then sparkbuild's."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[*CSV_COLUMNS, *SPARKBUILD_CSV_COLUMNS])
    writer.writeheader()
    for row in rows(report):
        line = {"model": as_text(row["model"]), "test_name": row["test_name"]}
        for key in ("t_s", "t_s_req", "e2e_ttft", "engine_t_s_req"):
            line[f"{key}_mean"], line[f"{key}_std"] = _split(row.get(key))
        for key in SPARKBUILD_CSV_COLUMNS[2:]:  # the engine's figures are split above
            line[key] = row.get(key, "")
        writer.writerow({k: v for k, v in line.items() if k in writer.fieldnames})
    return buffer.getvalue()


def _fmt(pair: tuple[float, float] | None) -> str:
    return "" if pair is None else f"{pair[0]:.2f} ± {pair[1]:.2f}"


def to_markdown(report: BenchReport) -> str:
    """llama-benchy's Markdown table (its headers and ``mean ± std`` cells), then sparkbuild's
    engine rate and burst count."""
    multi = max(report.sweep.concurrency, default=1) > 1
    headers = [*(MD_HEADERS if multi else MD_HEADERS_C1), *SPARKBUILD_MD_HEADERS]
    lines = [
        "| " + " | ".join(headers) + " |",
        "|:" + "|".join(["-" * 3] + ["--:"] * (len(headers) - 1)) + "|",
    ]
    for row in rows(report):
        values = [row["model"], row["test_name"], _fmt(row["t_s"])]
        if multi:
            values.append(_fmt(row["t_s_req"]))
        values += ["", ""] if multi else [""]  # peak t/s: not measured
        values += ["", "", _fmt(row.get("e2e_ttft"))]  # ttfr, est_ppt: not measured
        values += [_fmt(row.get("engine_t_s_req")), row.get("burst_runs", "")]
        lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


# --- its JSON and CSV, from a sparkbuild report ------------------------------------------


def _metric(values: Sequence[float | None], scale: float = 1.0) -> dict[str, object] | None:
    """llama-benchy's ``{mean, std, values}`` (numpy's std: ddof 0), or None with no value."""
    present = [round(v * scale, 6) for v in values if v is not None]
    if not present:
        return None
    mean, std = statistics.fmean(present), statistics.pstdev(present)
    return {"mean": round(mean, 6), "std": round(std, 6), "values": present}


def _benchmark_run(
    cell: CellResult, runs: Sequence[RunFigures], context: bool
) -> dict[str, object]:
    """One llama-benchy ``BenchmarkRun``: its totals are the batch's when concurrency > 1,
    the request's otherwise (``results.py``, ``add``). sparkbuild's runs stand where
    llama-benchy's batches do, so per-request values are each run's mean over its requests;
    sparkbuild measures no peaks, ttfr or est_ppt (null)."""
    batch = cell.concurrency > 1
    pp = _metric([r.prefill_tps_aggregate if batch else r.prefill_tps for r in runs])
    tg = _metric([r.decode_tps_aggregate if batch else r.decode_tps_request for r in runs])
    return {
        "concurrency": cell.concurrency,
        "context_size": cell.depth,
        "prompt_size": cell.pp,
        "response_size": cell.tg,
        "is_context_prefill_phase": context,
        "pp_throughput": pp,
        "pp_req_throughput": _metric([r.prefill_tps for r in runs]) if batch else pp,
        "tg_throughput": tg,
        "tg_req_throughput": _metric([r.decode_tps_request for r in runs]) if batch else tg,
        "peak_throughput": None,
        "peak_req_throughput": None,
        "ttfr": None,
        "est_ppt": None,
        "e2e_ttft": _metric([r.ttft_s for r in runs], 1000.0),
        "throughput_over_time": None,
        "requests_throughput_over_time": None,
    }


def to_json(report: BenchReport) -> dict[str, Any]:
    """The report as llama-benchy 0.4's ``--format json`` (its ``BenchmarkReport``): each
    cell in run order, its context load first when the sweep's prefix caching sent one."""
    benchmarks: list[dict[str, object]] = []
    for cell in report.cells:
        if cell.context_runs:
            benchmarks.append(_benchmark_run(cell, cell.context_runs, context=True))
        benchmarks.append(_benchmark_run(cell, cell.runs, context=False))
    return {
        "version": f"{report.harness.name} {report.harness.version}",
        "timestamp": report.created,
        "latency_mode": "none",  # no latency is measured or subtracted
        "latency_ms": 0.0,
        "model": report.engine.served_model or report.engine.model,
        "prefix_caching_enabled": report.sweep.prefix_caching,
        "max_concurrency": max(report.sweep.concurrency, default=1),
        "benchmarks": benchmarks,
    }


def _test_name(run: Mapping[str, Any], kind: str, suffix: str) -> str:
    depth = int(run["context_size"])
    if run.get("is_context_prefill_phase"):
        return f"ctx_{kind} @ d{depth}{suffix}"
    size = run["prompt_size"] if kind == "pp" else run["response_size"]
    return f"{kind}{size}{f' @ d{depth}' if depth > 0 else ''}{suffix}"


def json_to_csv(data: Mapping[str, Any]) -> str:
    """llama-benchy's CSV of its JSON: a pp row (prefill, TTFT) and a tg row (decode, peaks)
    per benchmark run, `` (cN)`` when the suite's highest concurrency is above 1, and the
    values as Python writes the floats (``results.py``, ``_generate_rows``, ``save_report``)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    multi = int(data.get("max_concurrency") or 1) > 1
    for run in data["benchmarks"]:
        suffix = f" (c{run['concurrency']})" if multi else ""
        rows = []
        if run.get("pp_throughput"):
            pp_metrics = (
                run["pp_throughput"],
                run["pp_req_throughput"],
                None,
                None,
                run["ttfr"],
                run["est_ppt"],
                run["e2e_ttft"],
            )
            rows.append(("pp", *pp_metrics))
        if run.get("tg_throughput") or run.get("peak_throughput"):
            tg_metrics = (
                run["tg_throughput"],
                run["tg_req_throughput"],
                run["peak_throughput"],
                run["peak_req_throughput"],
                None,
                None,
                None,
            )
            rows.append(("tg", *tg_metrics))
        for kind, *metrics in rows:
            line: dict[str, object] = {
                "model": as_text(str(data["model"])),
                "test_name": _test_name(run, kind, suffix),
            }
            for name, metric in zip(
                ("t_s", "t_s_req", "peak_ts", "peak_ts_req", "ttfr", "est_ppt", "e2e_ttft"),
                metrics,
                strict=True,
            ):
                line[f"{name}_mean"] = metric["mean"] if metric else None
                line[f"{name}_std"] = metric["std"] if metric else None
            writer.writerow(line)
    return buffer.getvalue()


# --- its CSV, read -----------------------------------------------------------------------

_ROW = re.compile(r"^(?P<kind>pp|tg)(?P<size>\d+)(?: @ d(?P<depth>\d+))?(?: \(c(?P<c>\d+)\))?\Z")
_CONTEXT_ROW = re.compile(r"^ctx_(pp|tg) @ d\d+(?: \(c\d+\))?\Z")


def is_csv(text: str) -> bool:
    """A llama-benchy CSV (or sparkbuild's ``--csv``, which starts with its columns)."""
    return text.startswith(",".join(CSV_COLUMNS[:4]))


def _csv_stat(row: Mapping[str, str], column: str, scale: float = 1.0) -> Stat:
    text = (row.get(f"{column}_mean") or "").strip()
    if not text:
        return Stat()
    return Stat(median=round(float(text) * scale, 4), n=1)  # a mean over runs: one figure


def _csv_cell(
    pp: Mapping[str, str], tg: Mapping[str, str] | None, key: re.Match[str], size: int
) -> CellResult:
    depth, concurrency = int(key["depth"] or 0), int(key["c"] or 1)
    return CellResult(
        pp=int(key["size"]),
        tg=size,
        depth=depth,
        concurrency=concurrency,
        ttft_s=_csv_stat(pp, "e2e_ttft", 0.001),
        prefill_tps=_csv_stat(pp, "t_s_req") if pp.get("t_s_req_mean") else _csv_stat(pp, "t_s"),
        prefill_tps_aggregate=_csv_stat(pp, "t_s"),
        decode_tps_request=Stat()
        if tg is None
        else (_csv_stat(tg, "t_s_req") if tg.get("t_s_req_mean") else _csv_stat(tg, "t_s")),
        decode_tps_aggregate=Stat() if tg is None else _csv_stat(tg, "t_s"),
        output_tps=Stat(),
        accept_len=None,
        prompt_tokens_target=depth + int(key["size"]),
        prompt_tokens=None,
        completion_tokens=None,
        requests=0,
        errors=0,
        runs=[],
    )


#: A llama-benchy CSV holds a row per test (tens, for a sweep); these bound what a file
#: within the 64 MiB read limit can make a compare hold or do.
MAX_CSV_ROWS = 10_000
MAX_CSV_COLUMNS = 64
MAX_CSV_FIELD = 16 * 1024  # characters: the flags column holds a run's engine arguments


def _lines(text: str) -> Iterator[str]:
    """``text`` line by line, as the csv reader takes it, without a copy of the whole."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end


def csv_rows(text: str) -> Iterator[tuple[int, dict[str, str]]]:
    """(line, row by column name) of a CSV, read as it streams: more than
    ``MAX_CSV_ROWS`` rows, ``MAX_CSV_COLUMNS`` columns or ``MAX_CSV_FIELD`` characters in a
    field, or what the csv module refuses (a NUL byte, a field over its own limit), is a
    ValueError naming the line and the limit."""
    reader = csv.reader(_lines(text))
    try:
        header = next(reader, [])
        if len(header) > MAX_CSV_COLUMNS:
            raise ValueError(f"line 1: {len(header)} columns, over {MAX_CSV_COLUMNS} (the limit)")
        for count, fields in enumerate(reader, start=1):
            if count > MAX_CSV_ROWS:
                raise ValueError(f"more than {MAX_CSV_ROWS} rows (the limit)")
            if len(fields) > len(header):
                raise ValueError(
                    f"line {reader.line_num}: {len(fields)} fields, the header has {len(header)}"
                )
            if any("\0" in field for field in fields):  # csv takes it since Python 3.13
                raise ValueError(f"line {reader.line_num}: a NUL byte")
            if any(len(field) > MAX_CSV_FIELD for field in fields):
                raise ValueError(
                    f"line {reader.line_num}: a field over {MAX_CSV_FIELD} characters (the limit)"
                )
            yield reader.line_num, dict(itertools.zip_longest(header, fields, fillvalue=""))
    except csv.Error as exc:  # a NUL byte, an unclosed quote, a field over csv's own limit
        raise ValueError(f"line {reader.line_num}: {exc}") from None


def _check_figures(number: int, row: Mapping[str, str]) -> None:
    """Every figure of the row (``*_mean``, ``*_std``) is a finite number, or empty."""
    for column, text in row.items():
        if not (column or "").endswith(("_mean", "_std")) or not text.strip():
            continue
        try:
            finite = math.isfinite(float(text))
        except ValueError:
            finite = False
        if not finite:
            raise ValueError(f"line {number}: {column} {text!r} is not a finite number")


def csv_to_report(text: str, path: Path) -> BenchReport:
    """A llama-benchy CSV as a (client-side only) report for ``bench compare``: each pp row
    with the tg row after it is one cell; context-load rows are left out, as in its JSON.
    The CSV holds means and deviations only, so each figure is one number (``n`` 1).
    Raises ValueError on a row that does not have llama-benchy's shape, and past the
    limits of :func:`csv_rows`."""
    cells: list[CellResult] = []
    pending: tuple[dict[str, str], re.Match[str]] | None = None
    model = ""
    for number, row in csv_rows(text):
        model = model or row.get("model") or ""
        name = (row.get("test_name") or "").strip()
        if _CONTEXT_ROW.match(name):
            continue
        match = _ROW.match(name)
        if match is None:
            raise ValueError(f"line {number}: test_name {name!r} is not llama-benchy's")
        _check_figures(number, row)
        if match["kind"] == "pp":
            if pending is not None:
                cells.append(_csv_cell(pending[0], None, pending[1], 0))
            pending = (row, match)
            continue
        same = pending is not None and (pending[1]["depth"], pending[1]["c"]) == (
            match["depth"],
            match["c"],
        )
        if pending is None or not same:
            raise ValueError(f"line {number}: {name!r} has no pp row before it")
        cells.append(_csv_cell(pending[0], row, pending[1], int(match["size"])))
        pending = None
    if pending is not None:
        cells.append(_csv_cell(pending[0], None, pending[1], 0))
    if not cells:
        raise ValueError("no benchmark rows")
    model = model or "unknown"
    return BenchReport(
        created="",
        label=f"llama-benchy CSV · {model} ({path.name})",
        profile=None,
        harness=HarnessInfo(
            name="llama-benchy",
            version="(CSV: not recorded)",
            sparkbuild="-",
            http_client="aiohttp",
        ),
        host=HostInfo(hostname="(not recorded)", platform="", machine="", cpus=None, python=""),
        target=TargetInfo(kind="url", value="(not recorded by llama-benchy)"),
        engine=EngineInfo(name="(not recorded)", model=model, served_model=model),
        sweep=Sweep(
            pp=sorted({c.pp for c in cells}),
            tg=sorted({c.tg for c in cells} - {0}) or [1],
            depth=sorted({c.depth for c in cells}),
            concurrency=sorted({c.concurrency for c in cells}),
            runs=1,
        ),
        complete=True,
        cells=cells,
    )
