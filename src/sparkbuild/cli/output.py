"""What commands share for output: running one action per build with a summary (JSON for
scripts and the early checks of output paths are in ``sparkbuild.outputs``, shared with the
stages that write their own outputs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from sparkbuild import console
from sparkbuild.cli.main import render_error
from sparkbuild.console import plural
from sparkbuild.errors import (
    BuildsFailedError,
    SparkbuildError,
    UnreachableError,
    VerdictFailedError,
    VerdictSkippedError,
)
from sparkbuild.jsontext import JsonObject
from sparkbuild.outputs import check_writable, emit_json

if TYPE_CHECKING:  # the spec module (pydantic) loads only with the commands that need it
    from sparkbuild.spec import Build


def failed_json(failures: Sequence[tuple[str, SparkbuildError]]) -> list[dict[str, object]]:
    """The ``failed`` list of a command's JSON: each build that stopped, why, and what to do."""
    return [{"build": name, "error": exc.message, "hint": exc.hint} for name, exc in failures]


class FailurePrinter:
    """Prints each build's error under its name as it happens, except that a URL which
    could not be reached at all is named once, with its cause, for the first build it
    stopped (offline, every build of an engine fails on the same URL; the command's last
    line names every build that failed). A hint already given is not repeated."""

    def __init__(self) -> None:
        self._urls: set[tuple[str, str]] = set()
        self._hints: set[str] = set()

    def show(self, name: str, exc: SparkbuildError) -> None:
        if isinstance(exc, UnreachableError) and exc.url:
            if (exc.url, exc.cause) in self._urls:
                return
            self._urls.add((exc.url, exc.cause))
        render_error(exc, build=name, hint=exc.hint not in self._hints)
        self._hints.add(exc.hint or "")


class _Reportable(Protocol):
    def to_json(self) -> JsonObject: ...


Result = TypeVar("Result", bound=_Reportable)


@dataclass(frozen=True)
class Verdicts(Generic[Result]):
    """For a stage whose results carry a verdict (preflight): a result that ran and did not
    pass has its reasons printed on stderr, and fails the command beside the builds that
    could not run, under one headline."""

    verdict: Callable[[Result], str]  # "pass", or what it was instead
    reasons: Callable[[Result], list[str]]  # one line each
    headline: str  # e.g. "preflight did not pass"
    hint: str
    # When every result that did not pass is "skip" and no build failed: the headline and
    # hint of a VerdictSkippedError (exit status 3) instead.
    skipped: tuple[str, str] | None = None


def run_per_build(
    builds: Sequence[Build],
    action: Callable[[Build], Result],
    *,
    summary: Callable[[Result], str],
    json_path: str | None,
    noun: str,
    verdicts: Verdicts[Result] | None = None,
    record: Callable[[Result], object] | None = None,
) -> list[Result]:
    """Run ``action`` on each build; one failure does not stop the others.

    A single build's error propagates as is; with several, each is printed, all results
    (and failures) go to JSON (``json_path``: ``-`` for stdout, replacing the summaries, or a
    file), and the command fails at the end naming the failed builds. ``record`` then
    stores each result; with ``verdicts``, results that did not pass fail the command too.
    """
    check_writable(json_path, "--json-file")  # before the first build runs, not after the last
    done: list[tuple[str, Result]] = []
    failures: list[tuple[str, SparkbuildError]] = []
    printer = FailurePrinter()
    for build in builds:
        try:
            result = action(build)
        except SparkbuildError as exc:
            failures.append((build.name, exc))
            if len(builds) > 1:
                printer.show(build.name, exc)
            continue
        done.append((build.name, result))
        if json_path != "-":
            console.out.print(summary(result), markup=False)
    results = [result for _, result in done]
    if json_path:  # one shape, for one build or many, whether they failed or not
        payload = {"results": [r.to_json() for r in results], "failed": failed_json(failures)}
        emit_json(payload, json_path)
    if len(builds) == 1 and failures:
        raise failures[0][1]  # the one build asked for: its own error, as is
    not_passed = _explain(done, verdicts) if verdicts is not None else []
    if record is not None:  # failing verdicts too: the lock says what ran and how it ended
        for result in results:
            record(result)
    if verdicts is not None and (not_passed or failures):
        names = [f"{n} ({verdicts.verdict(r)})" for n, r in not_passed]
        names += [f"{n} (error)" for n, _ in failures]
        only_skips = all(verdicts.verdict(r) == "skip" for _, r in not_passed)
        if verdicts.skipped is not None and only_skips and not failures:
            headline, hint = verdicts.skipped
            raise VerdictSkippedError(f"{headline}: {', '.join(names)}", hint)
        raise VerdictFailedError(f"{verdicts.headline}: {', '.join(names)}", verdicts.hint)
    if failures:
        names_text = ", ".join(name for name, _ in failures)
        raise BuildsFailedError(
            f"{len(failures)} of {plural(len(builds), noun.removesuffix('s'), noun)} failed: "
            f"{names_text}"
        )
    return results


def _explain(
    done: list[tuple[str, Result]], verdicts: Verdicts[Result]
) -> list[tuple[str, Result]]:
    """The results that did not pass, each reason printed on stderr under its build."""
    not_passed = [(name, r) for name, r in done if verdicts.verdict(r) != "pass"]
    for name, result in not_passed:
        for line in verdicts.reasons(result):
            console.err.print(f"{name}: {line}", markup=False)
    return not_passed
