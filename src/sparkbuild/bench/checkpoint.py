"""What a sweep keeps of itself while it runs: the report written after every finished cell
(``write_checkpoint``, what ``bench --resume`` goes on from), and the span of each process
that measured it (``ProcessClock``): a resumed sweep's time is its processes' together."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from sparkbuild import jsontext
from sparkbuild.bench.host import load_average
from sparkbuild.bench.results import TIME_FORMAT, BenchReport, ProcessSpan
from sparkbuild.errors import UsageError
from sparkbuild.redact import redact

#: The error of a report written after a cell, while the sweep goes on (``--json-file``):
#: what an interrupted sweep leaves, for ``bench --resume``.
UNFINISHED = "interrupted: written after the last finished cell; bench --resume FILE goes on"


@dataclass(frozen=True)
class ProcessClock:
    """When this process began (by the wall clock and the monotonic one), the host's load
    then, and how long its engine took to boot."""

    began: float
    started: str
    load_start: list[float] | None
    boot_seconds: float | None = None

    @classmethod
    def start(cls) -> ProcessClock:
        """Now, before the engine boots: the load is that of other work."""
        return cls(time.monotonic(), time.strftime(TIME_FORMAT), load_average())

    def booted(self, seconds: float | None) -> ProcessClock:
        return replace(self, boot_seconds=None if seconds is None else round(seconds, 2))

    def span(self, cells: list[str]) -> ProcessSpan:
        """This process's span until now, ``cells`` measured in it."""
        return ProcessSpan(
            started=self.started,
            ended=time.strftime(TIME_FORMAT),
            seconds=round(time.monotonic() - self.began, 2),
            boot_seconds=self.boot_seconds,
            cells=cells,
        )


def sweep_time(spans: Sequence[ProcessSpan]) -> tuple[float, float | None]:
    """The whole sweep's seconds and boot seconds: its processes' together."""
    boots = [span.boot_seconds for span in spans if span.boot_seconds is not None]
    return round(sum(span.seconds for span in spans), 2), (round(sum(boots), 2) if boots else None)


def write_checkpoint(path: Path, report: BenchReport) -> None:
    """The report so far, whole or not at all: a temporary file beside ``path``, renamed
    over it, so an interruption at any moment leaves the last finished cell's report."""
    text = redact(jsontext.dumps(report.model_dump(mode="json"), indent=2, sort_keys=True))
    scratch = ""
    try:
        handle, scratch = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text + "\n")
        os.chmod(scratch, 0o644)
        os.replace(scratch, path)
    except OSError as exc:
        if scratch:
            Path(scratch).unlink(missing_ok=True)
        raise UsageError(f"{path}: cannot write the sweep so far: {exc.strerror or exc}") from exc
