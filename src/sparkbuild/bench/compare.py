"""``bench compare``'s entry point: two reports side by side (B against A), or one report held
against claims files. ``run_compare`` takes frozen ``CompareOptions`` and returns a frozen
``Comparison``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sparkbuild import console
from sparkbuild.bench import report as bench_report
from sparkbuild.bench.claims_request import ClaimsRequest
from sparkbuild.bench.outputs import warn_left_out
from sparkbuild.bench.plot import plot_decode
from sparkbuild.errors import NothingToCompareError, UsageError
from sparkbuild.outputs import check_writable, emit_json
from sparkbuild.redact import write_redacted


@dataclass(frozen=True)
class CompareOutputs:
    """Where the comparison goes besides the terminal."""

    json_path: str | None = None  # '-': stdout (--json), else --json-file FILE
    markdown_path: Path | None = None
    plot_path: Path | None = None

    def check(self) -> None:
        """Every output path, before the reports are read."""
        for path, option in (
            (self.json_path, "--json-file"),
            (self.markdown_path, "--markdown"),
            (self.plot_path, "--plot"),
        ):
            check_writable(path, option)


@dataclass(frozen=True)
class CompareOptions:
    """Two reports, or one (``report_b`` None) with the claims to hold it against."""

    report_a: Path
    report_b: Path | None = None
    outputs: CompareOutputs = field(default_factory=CompareOutputs)
    claims: ClaimsRequest | None = None


@dataclass(frozen=True)
class Comparison:
    """The cells both reports share, and what else differs between the runs; empty for a
    report held against claims (its comparison is the claims')."""

    subject: str | None = None
    warnings: tuple[str, ...] = ()
    rows: tuple[dict[str, object], ...] = ()


def run_compare(options: CompareOptions) -> Comparison:
    """Compare, write the outputs and show the table; a claims comparison is shown by the
    claims request. Raises ``NothingToCompareError`` when the reports share no cell."""
    claims, report_b = options.claims, options.report_b
    if claims is not None or report_b is None:
        if claims is None or report_b is not None or options.outputs.plot_path is not None:
            raise UsageError(
                "bench compare takes two reports, or one report and --claims FILE (no --plot)",
                "e.g. sparkbuild bench compare run.json --claims claims/NAME.yaml",
            )
        claims.show(bench_report.load_report(options.report_a), append_markdown=False)
        return Comparison()
    return _two_reports(options.report_a, report_b, options.outputs)


def _two_reports(report_a: Path, report_b: Path, outputs: CompareOutputs) -> Comparison:
    a, b = bench_report.load_report(report_a), bench_report.load_report(report_b)
    label_a = a.label if a.label != b.label else f"{a.label} ({report_a.name})"
    label_b = b.label if a.label != b.label else f"{b.label} ({report_b.name})"
    subject, warnings = bench_report.compare_warnings(a, b)
    rows = bench_report.compare_rows(a, b)
    if subject:
        console.info(f"comparing {subject}")
    for warning in warnings:
        console.warn(warning)
    if not rows:
        raise NothingToCompareError(
            f"{report_a.name} and {report_b.name} have no cell in common",
            "run both with the same --pp/--tg/--depth/--concurrency",
        )
    json_path = outputs.json_path
    if json_path:
        payload = {"a": str(report_a), "b": str(report_b), "subject": subject}
        hosts = {"a": a.host.model_dump(), "b": b.host.model_dump()}
        emit_json({**payload, "hosts": hosts, "warnings": warnings, "cells": rows}, json_path)
    if outputs.markdown_path:
        write_redacted(
            outputs.markdown_path,
            bench_report.markdown_compare(rows, label_a, label_b, bench_report.host_rows(a, b)),
            "--markdown",
        )
    if outputs.plot_path:
        both = [a.model_copy(update={"label": label_a}), b.model_copy(update={"label": label_b})]
        warn_left_out(plot_decode(both, outputs.plot_path), outputs.plot_path)
    if json_path != "-":  # the hosts first: what the percentages are measured on
        bench_report.render_hosts(a, b, console.out)
        bench_report.render_compare(rows, label_a, label_b, console.out)
    return Comparison(subject, tuple(warnings), tuple(rows))
