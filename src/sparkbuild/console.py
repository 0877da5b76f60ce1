"""Everything sparkbuild prints goes through here: whether progress is shown (never with
--quiet or without a TTY), and what text may reach a terminal.

The consoles ``out`` and ``err`` pass every string and Text they render through
:func:`safe`: secrets masked (:func:`sparkbuild.redact.redact`), control characters,
escape sequences and bidi overrides shown escaped (``\\x1b``, ``\\u202e``) instead of acting
on the terminal, and a line too long to read (a 120 KB argument) cut, with its length.
Engine text, report labels, file and build names are data, never terminal commands.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import IO, Any, cast

from rich.cells import cell_len
from rich.console import Console, ConsoleDimensions, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.status import Status
from rich.style import StyleType
from rich.table import Table
from rich.text import Span, Text

from sparkbuild.redact import redact

# C0 controls but tab and newline, DEL and C1 controls, and the bidi marks, embeddings,
# overrides and isolates (the "Trojan Source" characters).
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff]"
)
LONGEST_LINE = 4096  # characters; longer lines are cut
LONGEST_WORD = 1024  # a run without spaces or quotes (one argument, one name)
SHOWN_OF_LONG = 200
_LONG_WORD = re.compile(rf"[^\s'\"]{{{LONGEST_WORD + 1},}}")

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

Edit = tuple[int, int, str]  # replace [start, end) with the text


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _escapes(plain: str) -> list[Edit]:
    return [(m.start(), m.end(), _escape(m.group())) for m in _UNSAFE.finditer(plain)]


def _long_words(plain: str) -> list[Edit]:
    """A huge argument echoed in a message: its start and its length."""
    return [
        (m.start() + SHOWN_OF_LONG, m.end(), f"… [{m.end() - m.start()} characters]")
        for m in _LONG_WORD.finditer(plain)
    ]


def _long_lines(plain: str) -> list[Edit]:
    edits = []
    start = 0
    for line in plain.split("\n"):
        if len(line) > LONGEST_LINE:
            note = f"… [{len(line)} characters]"
            edits.append((start + SHOWN_OF_LONG, start + len(line), note))
        start += len(line) + 1
    return edits


def _redactions(plain: str) -> list[Edit]:
    """Redaction as edits: the unchanged head and tail around one replaced middle."""
    clean = redact(plain)
    if clean == plain:
        return []
    head = 0
    while head < min(len(plain), len(clean)) and plain[head] == clean[head]:
        head += 1
    tail = 0
    while (
        tail < min(len(plain), len(clean)) - head
        and plain[len(plain) - 1 - tail] == clean[len(clean) - 1 - tail]
    ):
        tail += 1
    return [(head, len(plain) - tail, clean[head : len(clean) - tail])]


_PASSES: tuple[Callable[[str], list[Edit]], ...] = (
    _redactions,
    _escapes,
    _long_words,
    _long_lines,
)


def _apply(plain: str, edits: Iterable[Edit]) -> tuple[str, Callable[[int, bool], int]]:
    """``plain`` edited, and a map from old offsets to new ones (for the Text's spans)."""
    pieces: list[str] = []
    marks: list[tuple[int, int, int, int]] = []  # old start, old end, new start, new end
    position = written = 0
    for start, end, replacement in edits:
        pieces.append(plain[position:start])
        written += start - position
        pieces.append(replacement)
        marks.append((start, end, written, written + len(replacement)))
        written += len(replacement)
        position = end
    pieces.append(plain[position:])

    def moved(offset: int, is_end: bool) -> int:
        shift = 0
        for old_start, old_end, new_start, new_end in marks:
            if offset <= old_start:
                break
            if offset < old_end:  # inside an edited stretch: the span covers all of it
                return new_end if is_end else new_start
            shift = new_end - old_end
        return offset + shift

    return "".join(pieces), moved


def safe(text: str) -> str:
    """``text`` as it may reach a terminal or a log: redacted, controls escaped, cut."""
    for edits_of in _PASSES:
        edits = edits_of(text)
        if edits:
            text, _ = _apply(text, edits)
    return text


def clipped(value: object, limit: int = SHOWN_OF_LONG) -> str:
    """``value`` as text for a record (a finding, an error): redacted first, then cut to
    ``limit`` characters with its full length said, so that what another party sent (a
    registry, an engine) cannot grow a record, and no cut leaves part of a secret."""
    text = redact(str(value))
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text)} characters]"


def safe_text(text: Text) -> Text:
    """:func:`safe` for a rich Text, its styles kept on the characters they covered."""
    for edits_of in _PASSES:
        edits = edits_of(text.plain)
        if not edits:
            continue
        plain, moved = _apply(text.plain, edits)
        copy = Text(
            plain,
            style=text.style,
            justify=text.justify,
            overflow=text.overflow,
            no_wrap=text.no_wrap,
            end=text.end,
            tab_size=text.tab_size,
        )
        copy.spans = [
            Span(moved(span.start, False), moved(span.end, True), span.style)
            for span in text.spans
            if moved(span.end, True) > moved(span.start, False)
        ]
        text = copy
    return text


class SafeConsole(_Console):
    """A rich Console that renders every string and Text through :func:`safe_text`."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return safe_text(super().render_str(text, **kwargs))

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        if isinstance(renderable, Text):
            renderable = safe_text(renderable)
        elif isinstance(renderable, Table):
            _safe_cells(renderable)
        return super().render(renderable, options)


def _safe_cells(table: Table) -> None:
    """A table's Text cells made safe before it measures them, so the columns fit what is
    shown (str cells are made safe by ``render_str``, which measuring calls too)."""
    for column in table.columns:
        column._cells = [safe_text(c) if isinstance(c, Text) else c for c in column._cells]
        if isinstance(column.header, Text):
            column.header = safe_text(column.header)


class SafeStream:
    """A text stream that writes :func:`safe` text to ``stream`` (for click's own messages
    and streamed build output, which do not go through a rich console)."""

    def __init__(self, stream: Callable[[], IO[str]]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream().write(safe(text))

    def flush(self) -> None:
        self._stream().flush()

    def isatty(self) -> bool:
        return self._stream().isatty()


err = SafeConsole(stderr=True, highlight=False, soft_wrap=True)
out = SafeConsole(highlight=False, soft_wrap=True)
# typed as a stream: click and the build streamer only write, flush and ask isatty
err_stream = cast(IO[str], SafeStream(lambda: sys.stderr))


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``1 build``, ``2 builds``: a count and its noun, in the number the count asks for."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


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
        err.print(message, markup=False)


def warn(message: str) -> None:
    """Warnings are shown even with --quiet: they change what the user should believe."""
    err.print(f"warning: {message}", style="yellow", markup=False)


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
            self._live.update(Text(safe(message)))
        else:
            info(message)

    def detail(self, message: str) -> None:
        if self._live is not None:
            self._live.update(Text(safe(f"{self._stage} · {message}")))


@contextmanager
def activity(message: str) -> Iterator[Activity]:
    """An :class:`Activity` starting at its first stage ``message``."""
    if interactive():
        with err.status(Text(safe(message))) as live:
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
        with err.status(Text(safe(message))) as spinner:
            yield lambda detail: spinner.update(Text(safe(f"{message}: {detail}")))
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


def _plain(cell: object) -> str:
    if isinstance(cell, Breakable):
        return cell.text
    return cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain


def _widest_word(cell: object) -> int:
    return max((cell_len(word) for word in _plain(cell).split()), default=0)


# Where a name may break: after a path separator, or after whitespace.
_BREAKS = re.compile(r"(?<=/)|(?<=\s)(?=\S)")


class Breakable:
    """Text that wraps at path separators and spaces, never inside a file name's parts
    (rich folds a long path mid-word: ``patches/pkg/appl|ies.patch``)."""

    def __init__(self, text: str, style: StyleType = "") -> None:
        self.text = safe(text)  # a table's cells are made safe, and this is one
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
