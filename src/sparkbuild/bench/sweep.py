"""The sweep grid: prompt length x generation length x context depth x concurrency."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sparkbuild.adapters import MAX_TOKENS
from sparkbuild.errors import UsageError

#: The most requests one cell may open at once; beyond that a client machine, not the engine,
#: is what gets measured.
MAX_CONCURRENCY = 1024
#: The most runs of a cell: a cell's prompts for all its runs are made before the first.
MAX_RUNS = 100
#: The most cells of a sweep (each is at least one run of one request).
MAX_CELLS = 10_000


@dataclass(frozen=True)
class Bound:
    """What one grid option takes: its flag and its least and greatest value."""

    flag: str
    low: int
    high: int


#: The grid's bounds, one table for the command line (``cli/bench_options``) and for a sweep
#: read from a file (``bench --resume``): a file cannot ask for what the flags refuse.
BOUNDS = {
    "pp": Bound("--pp", 1, MAX_TOKENS),
    "tg": Bound("--tg", 1, MAX_TOKENS),
    "depth": Bound("--depth", 0, MAX_TOKENS),
    "concurrency": Bound("--concurrency", 1, MAX_CONCURRENCY),
    "runs": Bound("--runs", 1, MAX_RUNS),
}


def parse_int_list(text: str, *, minimum: int) -> list[int]:
    """``"512,2048"`` as ``[512, 2048]``; raises ValueError with a message naming the item."""
    values: list[int] = []
    for part in text.split(","):
        item = part.strip()
        if not item:
            raise ValueError(f"{text!r} has an empty item; use e.g. 512,2048")
        try:
            value = int(item)
        except ValueError:
            raise ValueError(f"{item!r} is not a whole number (in {text!r})") from None
        if value < minimum:
            raise ValueError(f"{value} is below the minimum {minimum} (in {text!r})")
        if value not in values:
            values.append(value)
    return values


@dataclass(frozen=True, order=True)
class CellKey:
    """One point of the grid."""

    pp: int  # prompt tokens
    tg: int  # generated tokens per request
    depth: int  # filler context tokens in front of the prompt
    concurrency: int  # requests in flight at once

    @property
    def prompt_tokens(self) -> int:
        """What the engine prefills per request: context depth plus prompt."""
        return self.depth + self.pp

    def label(self) -> str:
        return f"pp={self.pp} tg={self.tg} depth={self.depth} c={self.concurrency}"


class Scheduled(BaseModel):
    """One step of a fixed schedule: a (depth, concurrency) pair, every pp x tg inside it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    depth: int = Field(ge=0)
    concurrency: int = Field(ge=1)


class Sweep(BaseModel):
    """What a bench run measures; stored verbatim in the report."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pp: list[int] = Field(default=[512, 2048], min_length=1)
    tg: list[int] = Field(default=[128], min_length=1)
    depth: list[int] = Field(default=[0], min_length=1)
    concurrency: list[int] = Field(default=[1, 4, 8], min_length=1)
    runs: int = Field(default=3, ge=1)
    seed: int = 0
    warmup: bool = True
    #: Cells whose depth+pp+tg exceed this were left out: longer than the engine serves.
    max_len: int | None = None
    name: str | None = None  # a named sweep (``bench --sweep``), e.g. spark-arena-v2
    # Each run of a cell with depth first sends its context alone, so the measured request
    # finds the context in the engine's prefix cache (llama-benchy --enable-prefix-caching).
    prefix_caching: bool = False
    # A fixed run order of (depth, concurrency) pairs (a named sweep's, e.g. heat-aware);
    # None: the grid's own order.
    schedule: list[Scheduled] | None = None

    @model_validator(mode="after")
    def _schedule_in_grid(self) -> Sweep:
        if self.schedule is None:
            return self
        if len(self.depth) * len(self.concurrency) > MAX_CELLS:  # before the grid is made
            raise ValueError(f"a schedule of more than {MAX_CELLS} (depth, concurrency) pairs")
        pairs = [(s.depth, s.concurrency) for s in self.schedule]
        grid = set(itertools.product(self.depth, self.concurrency))
        if len(set(pairs)) != len(pairs) or set(pairs) != grid:
            raise ValueError("a schedule must list every (depth, concurrency) pair once")
        return self

    def grid(self) -> Iterator[CellKey]:
        """Every cell of the grid, in run order: the schedule's, else concurrency innermost,
        so one configuration's curve is measured back to back."""
        if self.schedule is not None:
            for step in self.schedule:
                for pp, tg in itertools.product(self.pp, self.tg):
                    yield CellKey(pp, tg, step.depth, step.concurrency)
            return
        for pp, tg, depth, concurrency in itertools.product(
            self.pp, self.tg, self.depth, self.concurrency
        ):
            yield CellKey(pp, tg, depth, concurrency)

    def cells(self) -> Iterator[CellKey]:
        """The cells measured: the grid's, less those longer than ``max_len``."""
        return (key for key in self.grid() if self.fits(key, self.max_len))

    @staticmethod
    def fits(key: CellKey, limit: int | None) -> bool:
        return limit is None or key.prompt_tokens + key.tg <= limit

    @property
    def grid_size(self) -> int:
        """The grid's cells, counted without making them."""
        return len(self.pp) * len(self.tg) * len(self.depth) * len(self.concurrency)

    @property
    def cell_count(self) -> int:
        return sum(1 for _ in self.cells())


def out_of_bounds(sweep: Sweep) -> list[str]:
    """Every value of ``sweep`` that its option on the command line would refuse (outside
    :data:`BOUNDS`, listed twice), and a grid of more than :data:`MAX_CELLS` cells."""
    found: list[str] = []
    for name, bound in BOUNDS.items():
        value = getattr(sweep, name)
        values: list[int] = value if isinstance(value, list) else [value]
        found.extend(
            f"{name} {item} is outside {bound.low}-{bound.high}, what {bound.flag} takes"
            for item in values
            if not bound.low <= item <= bound.high
        )
        twice = sorted(item for item, n in Counter(values).items() if n > 1)
        if twice:
            found.append(f"{name} lists {', '.join(map(str, twice))} more than once")
    if sweep.grid_size > MAX_CELLS:
        found.append(f"its grid has {sweep.grid_size} cells, more than {MAX_CELLS}")
    return found


def bounds_summary(found: list[str]) -> str:
    """:func:`out_of_bounds`'s findings in one sentence (the first few of many)."""
    more = f" and {len(found) - 4} more" if len(found) > 4 else ""
    return f"its sweep is outside what the command line takes: {'; '.join(found[:4])}{more}"


def fit_to_length(sweep: Sweep, limit: int | None, whose: str) -> tuple[Sweep, list[CellKey]]:
    """``sweep`` without the cells longer than ``limit`` (``whose`` names where the limit
    comes from), and the cells left out; a UsageError when no cell fits."""
    if limit is None:
        return sweep, []
    dropped = [key for key in sweep.cells() if not Sweep.fits(key, limit)]
    if not dropped:
        return sweep, []
    if len(dropped) == sweep.cell_count:
        shortest = min(dropped, key=lambda k: k.prompt_tokens + k.tg)
        raise UsageError(
            f"no cell fits {whose} {limit} tokens (the shortest, {shortest.label()}, needs "
            f"depth+pp+tg = {shortest.prompt_tokens + shortest.tg})",
            "lower --pp/--depth/--tg, or serve with a larger max model length",
        )
    capped = limit if sweep.max_len is None else min(limit, sweep.max_len)
    return sweep.model_copy(update={"max_len": capped}), dropped


def left_out_warning(dropped: list[CellKey], limit: int, whose: str) -> str:
    shown = "; ".join(key.label() for key in dropped[:4])
    more = f" and {len(dropped) - 4} more" if len(dropped) > 4 else ""
    return (
        f"{len(dropped)} cell(s) need more than {whose} {limit} tokens (depth+pp+tg) and are "
        f"left out: {shown}{more}"
    )
