"""One place that decides whether progress is shown: never with --quiet or without a TTY."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.cells import cell_len
from rich.console import Console, ConsoleDimensions, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.status import Status
from rich.style import StyleType
from rich.table import Table
from rich.text import Text

from sparkbuild.validate import redact_url

# Wide enough for any table we print; only tables (expand=False) take what they need.
UNBOUNDED_WIDTH = 4096


class _Console(Console):
    """Without a terminal (a file, a pipe, CI's log) as wide as what is printed needs: rich
    would otherwise render every table at 80 columns and cut its figures (``272…``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._width_given = kwargs.get("width") is not None

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self.is_terminal or self._width_given:
            return size
        return ConsoleDimensions(UNBOUNDED_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]
        self._width_given = True


_state = {"quiet": False}
err = _Console(stderr=True, highlight=False, soft_wrap=True)
out = _Console(highlight=False, soft_wrap=True)


def set_quiet(quiet: bool) -> None:
    _state["quiet"] = quiet


def is_quiet() -> bool:
    return _state["quiet"]


def interactive() -> bool:
    """Whether live progress (spinners, streamed build output) should be drawn."""
    return not _state["quiet"] and sys.stderr.isatty()


def info(message: str) -> None:
    """A one-line progress note on stderr, dropped with --quiet."""
    if not _state["quiet"]:
        err.print(redact_url(message), markup=False)


def warn(message: str) -> None:
    """Warnings are shown even with --quiet: they change what the user should believe."""
    err.print(f"warning: {redact_url(message)}", style="yellow", markup=False)


class Activity:
    """What a long step is doing. In a terminal one live line (a spinner) that each stage
    and detail updates in place; without one, one plain line per stage (details, such as
    the seconds waited, would flood a CI log); nothing with --quiet."""

    def __init__(self, live: Status | None) -> None:
        self._live = live
        self._stage = ""

    def stage(self, message: str) -> None:
        self._stage = message
        if self._live is not None:
            self._live.update(Text(redact_url(message)))
        else:
            info(message)

    def detail(self, message: str) -> None:
        if self._live is not None:
            self._live.update(Text(redact_url(f"{self._stage} · {message}")))


@contextmanager
def activity(message: str) -> Iterator[Activity]:
    """An :class:`Activity` starting at its first stage ``message``."""
    if interactive():
        with err.status(Text(redact_url(message))) as live:
            current = Activity(live)
            current.stage(message)
            yield current
    else:
        current = Activity(None)
        current.stage(message)
        yield current


@contextmanager
def status(message: str) -> Iterator[Callable[[str], None]]:
    """A spinner on a TTY; a single line otherwise; nothing with --quiet.

    Yields ``update(detail)``: on a TTY the spinner then reads "message: detail" (a fetch's
    progress, say); otherwise details are dropped, so logs keep one line per step."""
    if interactive():
        # Text, not str: a str status is parsed as markup, and names like fix[/x] are data.
        with err.status(Text(redact_url(message))) as spinner:
            yield lambda detail: spinner.update(Text(redact_url(f"{message}: {detail}")))
    else:
        info(message)
        yield lambda detail: None


def keep_figures(table: Table) -> Table:
    """Figures win over labels when a table is squeezed: every right-aligned (figure) column
    is at least as wide as its widest figure, so rich wraps the labels and headers (and a
    cell such as ``800 → 812 (+1.5%)`` at its spaces) instead of cutting a number to
    ``272…``."""
    for column in table.columns:
        cells = list(column.cells)
        if column.justify == "right":
            widest = max((_widest_word(cell) for cell in (column.header, *cells)), default=0)
            column.overflow = "fold"
        else:  # rich squeezes a column below its words; a file name keeps its parts
            widest = max((c.widest_piece() for c in cells if isinstance(c, Breakable)), default=0)
        column.min_width = max(column.min_width or 0, widest) or None
    return table


def show_table(target: Console, table: Table) -> None:
    """Print ``table`` with its figures whole: squeezed, labels wrap first; where even its
    narrowest form is wider than the terminal, one plain line per row (``header value``
    pairs, wrapped at spaces) instead of a table whose right-hand columns would be cut."""
    keep_figures(table)
    unbounded = target.options.update_width(UNBOUNDED_WIDTH)
    narrowest = Measurement.get(target, unbounded, table).minimum
    if narrowest <= target.width:
        target.print(table)
        return
    for caption in (table.title, table.caption):
        if caption:
            target.print(caption, soft_wrap=False)
    headers = [_plain(column.header) for column in table.columns]
    for row in zip(*(column.cells for column in table.columns), strict=True):
        pairs = [(h, _plain(cell) or "-") for h, cell in zip(headers, row, strict=True)]
        for number, line in enumerate(_pack(pairs, target.width - 2)):
            target.print(Text("  " if number else "") + line, soft_wrap=False)


def _pack(pairs: list[tuple[str, str]], width: int) -> Iterator[Text]:
    """``header value`` pairs on as few lines as fit ``width``, never split between lines."""
    line = Text()
    for header, value in pairs:
        pair = Text.assemble((header, "bold"), " ", value)
        if line.plain and cell_len(line.plain) + 3 + pair.cell_len > width:
            yield line
            line = Text()
        line += Text("   ") + pair if line.plain else pair
    yield line


def _plain(cell: Any) -> str:
    if isinstance(cell, Breakable):
        return cell.text
    return cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain


def _widest_word(cell: Any) -> int:
    return max((cell_len(word) for word in _plain(cell).split()), default=0)


# Where a name may break: after a path separator, or after whitespace.
_BREAKS = re.compile(r"(?<=/)|(?<=\s)(?=\S)")


class Breakable:
    """Text that wraps at path separators and spaces, never inside a file name's parts
    (rich folds a long path mid-word: ``patches/pkg/appl|ies.patch``)."""

    def __init__(self, text: str, style: StyleType = "") -> None:
        self.text = text
        self.style = style

    def _pieces(self, line: str) -> list[str]:
        return [piece for piece in _BREAKS.split(line) if piece]

    def widest_piece(self) -> int:
        lines = self.text.splitlines()
        return max((cell_len(p.rstrip()) for line in lines for p in self._pieces(line)), default=0)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widest_line = max((cell_len(line) for line in self.text.splitlines()), default=0)
        return Measurement(min(self.widest_piece(), options.max_width), widest_line)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(options.max_width, 1)
        for line in self.text.splitlines() or [""]:
            for wrapped in self._wrap(line, width):
                yield Text(wrapped, style=self.style, end="\n")

    def _wrap(self, line: str, width: int) -> Iterator[str]:
        current = ""
        for piece in self._pieces(line):
            if current and cell_len((current + piece).rstrip()) > width:
                yield current.rstrip()
                current = ""
            current += piece
            while cell_len(current.rstrip()) > width:  # one piece wider than the column
                yield current[:width]
                current = current[width:]
        yield current.rstrip()
