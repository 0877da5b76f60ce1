"""One place that decides whether progress is shown: never with --quiet or without a TTY."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.text import Text

from sparkbuild.validate import redact_url

_state = {"quiet": False}
err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


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
