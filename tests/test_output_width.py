"""Output that never hides a number: without a terminal, tables take the width they need;
on a narrow terminal figures stay whole (labels wrap, or one plain line per row), and file
names wrap at their separators."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sparkbuild.bench import report as bench_report
from sparkbuild.console import Breakable, show_table
from tests.support.cli import RunCli
from tests.test_bench_figures import _report

FIGURES = ("0.040 → 0.040 (+0.0%)", "800 → 800 (+0.0%)", "125 → 125 (+0.0%)", "250 → 250")


def _terminal(width: int) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=width, force_terminal=True, color_system=None), buffer


def test_compare_redirected_to_a_file_holds_every_figure(run_cli: RunCli, tmp_path: Path) -> None:
    report = str(_report(tmp_path))
    result = run_cli("bench", "compare", report, report)  # stdout is no terminal here
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    for figure in FIGURES:
        assert figure in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) > 80  # a table, not cut to 80


def test_at_80_columns_figures_stay_whole(tmp_path: Path) -> None:
    report = bench_report.load_report(_report(tmp_path))
    console, buffer = _terminal(80)
    bench_report.render(report, console)
    rows = bench_report.compare_rows(report, report)
    bench_report.render_compare(rows, "a", "b", console)
    text = buffer.getvalue()
    assert "…" not in text
    assert all(len(line) <= 80 for line in text.splitlines())
    for figure in ("0.040", "800", "125", "250", *FIGURES):
        assert figure in text
    assert "decode tok/s total 250" in text  # a header and its figure stay together


def test_figure_columns_win_over_labels_when_squeezed() -> None:
    table = Table()
    table.add_column("setting")
    table.add_column("prefill tok/s", justify="right")
    table.add_row("a long label that can wrap over several lines", "272345.5")
    console, buffer = _terminal(30)
    show_table(console, table)
    text = buffer.getvalue()
    assert "272345.5" in text and "…" not in text
    assert "label" in text and "several" in text


def test_file_names_wrap_at_separators() -> None:
    table = Table()
    table.add_column("item")
    table.add_column("detail")
    name = "patches/sglang/spec-defaults.patch"
    table.add_row(Breakable(name), Breakable("does not apply: python/sglang/srt/server_args.py"))
    console, buffer = _terminal(40)
    show_table(console, table)
    cells = [
        part.strip()
        for line in buffer.getvalue().splitlines()
        for part in line.strip("│┃ ").split("│")
    ]
    assert "spec-defaults.patch" in cells  # whole, after its directory
    assert "patches/sglang/" in cells or "patches/" in cells
    assert "python/sglang/srt/" in cells or "server_args.py" in cells
    assert not any(c.endswith(("spec-def", "server_a")) for c in cells)
