"""Where a bench report goes besides the terminal: JSON, a Markdown table, a CSV, a plot, a
Spark Arena submission, the lock's bench section; every path checked before the boot."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sparkbuild import console
from sparkbuild.bench import report as bench_report
from sparkbuild.bench.claims_request import ClaimsRequest
from sparkbuild.bench.plot import plot_decode
from sparkbuild.bench.results import BenchReport
from sparkbuild.outputs import check_writable, emit_json
from sparkbuild.redact import write_redacted


def warn_left_out(left_out: list[str], path: Path) -> None:
    """A plot says what it could not draw (a series with only burst runs has no line)."""
    if left_out:
        console.warn(f"{path} leaves out {len(left_out)} cell(s): " + "; ".join(left_out))


@dataclass(frozen=True)
class BenchOutputs:
    """Where the report goes: files, the Markdown table's columns, the lock's bench section."""

    json_path: str | None = None  # '-': stdout (--json), else --json-file FILE
    markdown_path: Path | None = None
    table_style: str = "sparkbuild"
    csv_path: Path | None = None
    plot_path: Path | None = None
    record_build: str | None = None
    arena_dir: Path | None = None  # a Spark Arena submission (bench/arena.py)

    def write(self, report: BenchReport) -> None:
        from sparkbuild.bench import llama_benchy

        if self.json_path:
            emit_json(report.model_dump(mode="json"), self.json_path)
        if self.markdown_path:
            text = (
                llama_benchy.to_markdown(report)
                if self.table_style == "llama-benchy"
                else bench_report.markdown(report)
            )
            write_redacted(self.markdown_path, text, "--markdown")
        if self.csv_path:
            self.csv_path.parent.mkdir(parents=True, exist_ok=True)
            write_redacted(self.csv_path, llama_benchy.to_csv(report), "--csv")
        if self.plot_path and report.cells:
            warn_left_out(plot_decode([report], self.plot_path), self.plot_path)

    def check(self, claims: ClaimsRequest | None) -> None:
        """Every output path, before the engine boots: a sweep's hour is not lost to a typo."""
        paths: list[tuple[str | Path | None, str]] = [
            (self.json_path, "--json-file"),
            (self.markdown_path, "--markdown"),
            (self.csv_path, "--csv"),
            (self.plot_path, "--plot"),
        ]
        if claims is not None:
            paths.append((claims.json_path, claims.json_option))
        for path, option in paths:
            check_writable(path, option)
