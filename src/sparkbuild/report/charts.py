"""Bench charts as data for inline SVG: series of points in the chart's own coordinates.

The geometry is computed here and drawn by the ``chart`` macro of the templates, so no page
needs JavaScript or an image file. The x axis is categorical (the concurrencies or prompt
lengths the sweep measured, evenly spaced); the y axis starts at zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sparkbuild import lockfile
from sparkbuild.bench.record import bench_cell
from sparkbuild.bench.report import number
from sparkbuild.bench.results import CellResult

WIDTH, HEIGHT = 480, 280
LEFT, RIGHT, TOP, BOTTOM = 54, 12, 12, 44
PALETTE = 8  # series colours: CSS classes s0..s7


@dataclass(frozen=True)
class CellFigures:
    """One sweep cell's medians, from the lock's record or the run's JSON."""

    pp: int
    tg: int
    depth: int
    concurrency: int
    ttft_s: float | None
    prefill_tps: float | None
    decode_request: float | None  # the client's per-request rate
    decode_engine: float | None  # the engine's own per-request rate
    decode_total: float | None  # the client's rate over all streams of the cell
    accept_len: float | None
    burst_runs: int
    errors: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.pp, self.tg, self.depth)

    @property
    def label(self) -> str:
        return f"pp={self.pp} tg={self.tg} depth={self.depth} c={self.concurrency}"

    @classmethod
    def from_lock(cls, cell: lockfile.BenchCell) -> CellFigures | None:
        if None in (cell.pp, cell.tg, cell.depth, cell.concurrency):
            return None
        return cls(
            pp=int(cell.pp or 0),
            tg=int(cell.tg or 0),
            depth=int(cell.depth or 0),
            concurrency=int(cell.concurrency or 0),
            ttft_s=_float(cell.ttft_s),
            prefill_tps=_float(cell.prefill_tps),
            decode_request=_float(cell.decode_tps_request),
            decode_engine=_float(cell.decode_tps_engine),
            decode_total=_float(cell.decode_tps_aggregate),
            accept_len=_float(cell.accept_len),
            burst_runs=cell.burst_runs or 0,
            errors=cell.errors or 0,
        )

    @classmethod
    def from_result(cls, cell: CellResult) -> CellFigures:
        """A bench run's cell, through the lock's shape of it (its medians)."""
        figures = cls.from_lock(bench_cell(cell))
        assert figures is not None  # a run's cell always has its shape
        return figures


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def shape_text(shape: tuple[int, int, int]) -> str:
    pp, tg, depth = shape
    return f"pp {pp} · tg {tg} · depth {depth}"


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    text: str  # the point's tooltip: its cell and value
    hollow: bool = False  # a cell with burst runs: the client's figure is partial


@dataclass(frozen=True)
class Series:
    name: str
    colour: int
    dashed: bool
    points: tuple[Point, ...]

    @property
    def path(self) -> str:
        return " ".join(
            f"{'M' if i == 0 else 'L'}{p.x:.1f},{p.y:.1f}" for i, p in enumerate(self.points)
        )


@dataclass(frozen=True)
class Tick:
    at: float
    text: str


@dataclass(frozen=True)
class Chart:
    title: str
    x_label: str
    y_label: str
    series: tuple[Series, ...]
    x_ticks: tuple[Tick, ...]
    y_ticks: tuple[Tick, ...]
    note: str | None = None  # why there is nothing to draw
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP
    bottom: int = HEIGHT - BOTTOM


def _nice_step(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten at or above ``value``."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(step * power for step in (1.0, 2.0, 2.5, 5.0, 10.0) if step * power >= value)


def _ticks(largest: float) -> tuple[float, list[str]]:
    """The axis top (a whole number of nice steps, about four) and the tick labels."""
    step = _nice_step(largest / 4)
    count = max(1, math.ceil(largest / step - 1e-9))
    digits = next(d for d in range(7) if abs(round(step * 10**d) - step * 10**d) < 1e-6 or d == 6)
    return step * count, [f"{step * i:.{digits}f}" for i in range(count + 1)]


Line = tuple[str, bool, Callable[[CellFigures], float | None]]  # (name, dashed, figure)


def _chart(  # noqa: PLR0913 - a chart's axes, grouping, lines and empty text, set by bench_charts
    title: str,
    x_label: str,
    y_label: str,
    cells: Sequence[CellFigures],
    x_of: Callable[[CellFigures], int],
    group_of: Callable[[CellFigures], tuple[int, ...]],
    group_text: Callable[[tuple[int, ...]], str],
    lines: Sequence[Line],
    empty: str,
) -> Chart:
    xs = sorted({x_of(c) for c in cells})
    values = [v for c in cells for _, _, figure in lines if (v := figure(c)) is not None]
    if not values:
        return Chart(title, x_label, y_label, (), (), (), note=empty)
    top, labels = _ticks(max(values))
    span_x = WIDTH - RIGHT - LEFT
    step = span_x / len(xs)
    column = {x: n for n, x in enumerate(xs)}  # a lookup, not a search: charts of many cells

    def x_at(value: int) -> float:
        return LEFT + step * (column[value] + 0.5)

    def y_at(value: float) -> float:
        return (HEIGHT - BOTTOM) - (value / top) * (HEIGHT - BOTTOM - TOP)

    grouped: dict[tuple[int, ...], list[CellFigures]] = {}
    for cell in cells:  # one pass: a filter per group is quadratic in the cells
        grouped.setdefault(group_of(cell), []).append(cell)
    series: list[Series] = []
    for index, group in enumerate(sorted(grouped)):
        members = sorted(grouped[group], key=x_of)
        for name, dashed, figure in lines:
            points = tuple(
                Point(x_at(x_of(c)), y_at(v), f"{c.label}: {name} {number(v)}", c.burst_runs > 0)
                for c in members
                if (v := figure(c)) is not None
            )
            if points:
                label = group_text(group) + (f" · {name}" if len(lines) > 1 else "")
                series.append(Series(label, index % PALETTE, dashed, points))
    y_ticks = tuple(Tick(y_at(top * i / (len(labels) - 1)), text) for i, text in enumerate(labels))
    x_ticks = tuple(Tick(x_at(x), str(x)) for x in xs)
    return Chart(title, x_label, y_label, tuple(series), x_ticks, y_ticks)


def bench_charts(cells: Sequence[CellFigures]) -> list[Chart]:
    """Decode tok/s per request (client beside engine) and in total against concurrency,
    TTFT against prompt length, and accept length against concurrency."""

    def by_shape(c: CellFigures) -> tuple[int, ...]:
        return c.shape

    def shape_words(group: tuple[int, ...]) -> str:
        return shape_text((group[0], group[1], group[2]))

    def concurrency(c: CellFigures) -> int:
        return c.concurrency

    def by_concurrency(title: str, y_label: str, lines: Sequence[Line], empty: str) -> Chart:
        """A chart against concurrency, a line per cell shape."""
        return _chart(
            title, "concurrency", y_label, cells, concurrency, by_shape, shape_words, lines, empty
        )

    return [
        by_concurrency(
            "Decode tok/s per request",
            "tok/s",
            [
                ("client", False, lambda c: c.decode_request),
                ("engine", True, lambda c: c.decode_engine),
            ],
            "no decode rate was measured",
        ),
        by_concurrency(
            "Decode tok/s in total",
            "tok/s",
            [("client", False, lambda c: c.decode_total)],
            "no total decode rate was measured (every run a burst?)",
        ),
        _chart(
            "Time to first token",
            "prompt tokens (depth + pp)",
            "seconds",
            cells,
            lambda c: c.depth + c.pp,
            lambda c: (c.tg, c.concurrency),
            lambda g: f"tg {g[0]} · c {g[1]}",
            [("TTFT", False, lambda c: c.ttft_s)],
            "no TTFT was measured",
        ),
        by_concurrency(
            "Accept length",
            "tokens per step",
            [("accept length", False, lambda c: c.accept_len)],
            "no drafts were proposed (speculation off): no accept length",
        ),
    ]
