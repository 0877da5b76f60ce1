"""The PNG plot: aggregate decode tokens/s against concurrency, one line per configuration.

matplotlib is an optional extra (``pip install 'sparkbuild[plot]'``); it is imported only here.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparkbuild import fileio
from sparkbuild.bench.results import BenchReport, CellResult
from sparkbuild.errors import MissingExtraError, PlotError
from sparkbuild.redact import redact


def require_matplotlib() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never a window, works without a display
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingExtraError(
            "--plot needs matplotlib, which is not installed",
            "pip install 'sparkbuild[plot]' (or pip install matplotlib), or drop --plot",
        ) from exc
    return plt


def _why_left_out(cell: CellResult) -> str:
    if cell.runs and cell.burst_runs == len(cell.runs):
        return "only burst runs (no client decode rate)"
    if cell.errors:
        return "failed requests"
    return "no decode rate"


def plot_decode(reports: Sequence[BenchReport], path: Path) -> list[str]:
    """Lines of median decode tok/s (min-max as error bars) per (report, pp, tg, depth).
    Returns what the plot leaves out (cells with no decode rate, and why), which the figure
    also notes under its axes."""
    plt = require_matplotlib()
    figure, axes = plt.subplots(figsize=(8, 5), dpi=120)
    lines = 0
    ticks: set[int] = set()
    left_out: list[str] = []
    for report in reports:
        configs = sorted({(c.pp, c.tg, c.depth) for c in report.cells})
        for pp, tg, depth in configs:
            cells = sorted(
                (c for c in report.cells if (c.pp, c.tg, c.depth) == (pp, tg, depth)),
                key=lambda c: c.concurrency,
            )
            points = [(c, c.decode_tps_aggregate) for c in cells]
            prefix = f"{report.label}: " if len(reports) > 1 else ""
            left_out += [
                f"{prefix}{c.key.label()}: {_why_left_out(c)}"
                for c, s in points
                if s.median is None
            ]
            points = [(c, s) for c, s in points if s.median is not None]
            if not points:
                continue
            xs = [c.concurrency for c, _ in points]
            ys = [s.median for _, s in points]
            low = [
                s.median - s.min for _, s in points if s.median is not None and s.min is not None
            ]
            high = [
                s.max - s.median for _, s in points if s.median is not None and s.max is not None
            ]
            name = f"pp={pp} tg={tg} depth={depth}"
            if len(reports) > 1:
                name = f"{redact(report.label)}: {name}"
            ticks.update(xs)
            axes.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=name)
            lines += 1
    if lines == 0:
        plt.close(figure)
        raise PlotError(
            f"nothing to plot into {path}: no cell has a decode rate",
            "check the cells' errors in the report",
        )
    axes.set_xscale("log", base=2)
    axes.set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)])
    axes.set_xlabel("concurrent requests")
    axes.set_ylabel("decode tokens/s (all streams)")
    axes.set_title(plot_title([r.label for r in reports]), fontsize="medium")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    if left_out:
        shown = "; ".join(left_out[:3]) + (
            f" and {len(left_out) - 3} more" if len(left_out) > 3 else ""
        )
        figure.text(0.01, 0.01, f"left out: {shown}", fontsize="x-small", wrap=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    image = io.BytesIO()
    figure.savefig(image, format="png")
    plt.close(figure)
    fileio.write_atomic(path, image.getvalue())  # whole or not at all
    return left_out


#: Characters of a title line that fit the 8-inch figure at the title's size.
TITLE_WIDTH = 70


def plot_title(labels: Sequence[str]) -> str:
    """ "Decode throughput: A vs B", wrapped to lines that fit the figure: a title wider
    than the figure is clipped at both ends (it is centred). Redacted: a PNG is a record
    too."""
    title = f"Decode throughput: {redact(' vs '.join(labels))}"
    return "\n".join(textwrap.wrap(title, TITLE_WIDTH, break_on_hyphens=False)) or title
