"""How a sweep shows its progress: nothing (a test, a library call), one line per stage and
cell (a CI log), or a live bar on a terminal (``CellProgress``, not with --quiet)."""

from __future__ import annotations

from types import TracebackType
from typing import Protocol

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.progress import Progress as RichProgress

from sparkbuild import console
from sparkbuild.bench.results import CellResult
from sparkbuild.bench.sweep import CellKey


class Progress(Protocol):
    def phase(self, message: str) -> None: ...

    def cell(self, index: int, total: int, key: CellKey) -> None: ...

    def carried(self, index: int, total: int, key: CellKey) -> None: ...

    def run(self, run: int, runs: int) -> None: ...

    def cell_done(self, result: CellResult) -> None: ...

    def waiting(self, detail: str) -> None: ...


class SilentProgress:
    def phase(self, message: str) -> None:
        return None

    def cell(self, index: int, total: int, key: CellKey) -> None:
        return None

    def carried(self, index: int, total: int, key: CellKey) -> None:
        return None

    def run(self, run: int, runs: int) -> None:
        return None

    def cell_done(self, result: CellResult) -> None:
        return None

    def waiting(self, detail: str) -> None:
        return None


class PlainProgress(SilentProgress):
    """Without a terminal (a CI log): one line per stage and per cell, nothing live."""

    def phase(self, message: str) -> None:
        console.info(message)

    def cell(self, index: int, total: int, key: CellKey) -> None:
        console.info(f"cell {index + 1}/{total}: {key.label()}")

    def carried(self, index: int, total: int, key: CellKey) -> None:
        console.info(
            f"cell {index + 1}/{total}: {key.label()}: carried, as the run resumed measured it"
        )


class CellProgress:
    """A rich progress bar on stderr (TTY only, not with --quiet): current cell and run,
    cells done (those a resumed sweep carried named apart) and remaining."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._bar = RichProgress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("cells · {task.fields[carried]}{task.fields[remaining]} to go"),
            TimeElapsedColumn(),
            console=console.err,
            transient=True,
        )
        self._task = self._bar.add_task("starting", total=total, remaining=total, carried="")
        self._carried = 0
        self._key: CellKey | None = None
        self._phase = ""

    def __enter__(self) -> CellProgress:
        self._bar.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._bar.stop()

    def phase(self, message: str) -> None:
        self._phase = message
        self._bar.update(self._task, description=message)

    def waiting(self, detail: str) -> None:
        self._bar.update(self._task, description=f"{self._phase} · {detail}")

    def cell(self, index: int, total: int, key: CellKey) -> None:
        self._key = key
        self._bar.update(self._task, description=key.label(), remaining=total - index)

    def carried(self, index: int, total: int, key: CellKey) -> None:
        self._carried += 1
        done = self._bar.tasks[0].completed + 1
        self._bar.update(
            self._task,
            description=f"{key.label()} · carried",
            advance=1,
            carried=f"{self._carried} carried · ",
            remaining=self.total - int(done),
        )

    def run(self, run: int, runs: int) -> None:
        label = self._key.label() if self._key else ""
        self._bar.update(self._task, description=f"{label} · run {run + 1}/{runs}")

    def cell_done(self, result: CellResult) -> None:
        done = self._bar.tasks[0].completed + 1
        self._bar.update(self._task, advance=1, remaining=self.total - int(done))
