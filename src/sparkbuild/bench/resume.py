"""``bench --resume FILE``: finish a sweep an earlier run left incomplete.

A sweep writes its report to its ``--json-file`` after every finished cell (atomically: a
temporary file beside it, renamed over it), so an interrupted sweep (Ctrl-C, a killed
process, a dead engine) keeps every finished cell there. ``--resume FILE`` reads that
report, takes its grid (cells, runs, seed, prefix caching, order) and reruns only the cells
it lacks; the finished ones are carried into the new report as they were measured.

The file is input like any other: its grid is held to the bounds the command line's flags
have (``sweep.BOUNDS``), and each cell it carries must be a cell of that grid, once, with the
grid's runs.

A resumed sweep measures the same engine, from the same host, or nothing: before the boot its
engine, profile, model, serve flags (named by flag), environment, target and host are held
against the earlier run's, and after the engine answers its version and served model; any
difference is refused, naming it. The prompts are the ones the whole sweep would have sent
(each cell's requests keep their numbers, and a carried cell's prompts are made again, not
sent, and held against the digest it was measured with), so a resumed report's prompt
fingerprint is an uninterrupted sweep's. Its time is the whole sweep's: each process's span
is kept (``processes``), and ``seconds`` is their sum.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from sparkbuild.bench.host import host_info
from sparkbuild.bench.report import argument_changes, load_report
from sparkbuild.bench.results import BenchReport, CellResult, EngineInfo, ProcessSpan, Resumed
from sparkbuild.bench.runner import BenchPlan, SweepSettings
from sparkbuild.bench.sweep import bounds_summary, out_of_bounds
from sparkbuild.errors import UsageError
from sparkbuild.redact import redact, secret_args, secret_env


@dataclass(frozen=True)
class Resume:
    """The earlier run a sweep continues."""

    path: Path
    earlier: BenchReport

    @property
    def done(self) -> tuple[CellResult, ...]:
        return tuple(self.earlier.cells)

    def settings(self, label: str | None) -> SweepSettings:
        """The earlier run's grid, order and name (its label unless another is given)."""
        return SweepSettings(self.earlier.sweep, label or self.earlier.label)

    def record(self) -> Resumed:
        return Resumed(file=str(self.path), cells=[c.key.label() for c in self.earlier.cells])

    def spans(self) -> tuple[ProcessSpan, ...]:
        """The earlier processes of the sweep; a report from before sparkbuild kept them
        stands for one, ending when it was written."""
        earlier = self.earlier
        if earlier.processes:
            return tuple(earlier.processes)
        carried = set(earlier.resumed_from.cells) if earlier.resumed_from else set()
        measured = [c.key.label() for c in earlier.cells if c.key.label() not in carried]
        return (
            ProcessSpan.ending(earlier.created, earlier.seconds, earlier.boot_seconds, measured),
        )


@dataclass(frozen=True)
class Launch:
    """What this run's engine is, for the check against the earlier run's: the engine's
    name, and the target's kind, description (as the report keeps it) and image id."""

    engine: str
    kind: str
    value: str
    image_id: str | None = None


def load_resume(path: Path) -> Resume:
    """The report at ``path``, if a sweep can continue from it: a sparkbuild report of an
    unfinished sweep, its grid within the command line's bounds and its cells in that grid."""
    earlier = load_report(path)
    if earlier.harness.name != "sparkbuild-bench":
        raise UsageError(
            f"--resume {path}: a {earlier.harness.name} report: only a sparkbuild bench "
            "report says how its engine ran"
        )
    refused = out_of_bounds(earlier.sweep)
    if refused:
        raise UsageError(
            f"--resume {path}: {bounds_summary(refused)}",
            "resume only a report a sparkbuild bench wrote, or start a new sweep",
        )
    strays = _stray_cells(earlier)
    if strays:
        more = f" and {len(strays) - 3} more" if len(strays) > 3 else ""
        raise UsageError(
            f"--resume {path}: {'; '.join(strays[:3])}{more}: a sweep carries only cells of "
            "its own grid, each once and whole",
            "resume only a report a sparkbuild bench wrote, or start a new sweep",
        )
    if earlier.complete and not earlier.pending_cells:
        raise UsageError(
            f"--resume {path}: its sweep is complete ({len(earlier.cells)} cells); nothing to "
            "resume",
            "run bench without --resume for a new sweep",
        )
    return Resume(path, earlier)


def _stray_cells(report: BenchReport) -> list[str]:
    """Each cell of ``report`` that its sweep would not have measured as it is: outside the
    grid, listed twice, or with another number of runs than the sweep's."""
    grid, seen = set(report.sweep.cells()), set()
    found: list[str] = []
    for cell in report.cells:
        key, runs = cell.key, len(cell.runs)
        if key not in grid:
            found.append(f"{key.label()} is not a cell of its sweep")
        elif key in seen:
            found.append(f"{key.label()} is listed twice")
        elif runs != report.sweep.runs:
            found.append(f"{key.label()} has {runs} runs, its sweep {report.sweep.runs}")
        seen.add(key)
    return found


def _shown(value: object) -> str:
    return redact(json.dumps(value, sort_keys=True, default=str))


def differences(resume: Resume, plan: BenchPlan, launch: Launch) -> list[str]:
    """Every engine setting of ``plan`` and ``launch`` that differs from the earlier run's,
    and the host when it is another."""
    earlier = resume.earlier
    engine = earlier.engine
    found: list[str] = []
    if launch.engine != engine.name:
        found.append(f"engine: {engine.name} then, {launch.engine} now")
    if (plan.profile or None) != (earlier.profile or None):
        found.append(f"profile: {earlier.profile} then, {plan.profile} now")
    if plan.model != engine.model:
        found.append(f"model: {engine.model} then, {plan.model} now")
    # A report keeps secrets masked (redact.secret_args, secret_env): compared as kept.
    args, then_args = secret_args(plan.args), secret_args(engine.args)
    if _shown(args) != _shown(then_args):
        found.append(f"serve flags: {argument_changes(then_args, args)}")
    env, then_env = secret_env(plan.env), secret_env(engine.env)
    if _shown(env) != _shown(then_env):
        names = sorted(
            set(then_env) ^ set(env)
            | {k for k in set(then_env) & set(env) if _shown(then_env[k]) != _shown(env[k])}
        )
        found.append(f"environment: {', '.join(names)}")
    found.extend(_target_difference(earlier, launch))
    host = _host_difference(earlier)
    if host:
        found.append(f"host: {host}")
    return found


def _target_difference(earlier: BenchReport, launch: Launch) -> list[str]:
    then = earlier.target
    if launch.kind != then.kind:
        return [f"target: {then.kind} then, {launch.kind} now"]
    found: list[str] = []
    value, then_value = redact(launch.value), redact(then.value)
    if launch.kind == "command":  # its --port is chosen afresh by each process
        value, then_value = _without_port(value), _without_port(then_value)
    if value != then_value:
        found.append(f"{then.kind}: {redact(then.value)} then, {redact(launch.value)} now")
    if launch.image_id and then.image_id and launch.image_id != then.image_id:
        found.append(f"image id: {then.image_id[:19]} then, {launch.image_id[:19]} now")
    return found


def _without_port(command: str) -> str:
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    kept = [w for w in words if not w.startswith("--port=")]
    for at in range(len(kept) - 1):
        if kept[at] == "--port":
            kept[at + 1] = "PORT"
    return shlex.join(kept)


def _host_difference(earlier: BenchReport) -> str:
    """How this host differs from the one the earlier run measured from (what both
    reports know of it: name, architecture, cores, CPU and memory)."""
    then, now = earlier.host, host_info()
    fields = ("hostname", "machine", "cpus", "cpu_model", "memory_gib")
    changed = [
        f"{name} {getattr(then, name)} then, {getattr(now, name)} now"
        for name in fields
        if getattr(then, name) is not None
        and getattr(now, name) is not None
        and getattr(then, name) != getattr(now, name)
    ]
    return ", ".join(changed)


def check_same_engine(resume: Resume, plan: BenchPlan, launch: Launch) -> None:
    """Refuse, before the boot, a resumed sweep of another engine or from another host,
    naming each difference."""
    found = differences(resume, plan, launch)
    if found:
        raise UsageError(
            f"--resume {resume.path}: this run's engine differs from that sweep's ("
            + "; ".join(found)
            + "): a resumed sweep must measure the same engine from the same host",
            "launch it as that run did, from that host, or start a new sweep without --resume",
        )


def check_same_answer(resume: Resume, info: EngineInfo) -> None:
    """Refuse, once the engine answers, a resumed sweep of another engine release or another
    served model (a URL that now serves something else)."""
    then = resume.earlier.engine
    found = [
        f"{what}: {before or 'not reported'} then, {now or 'not reported'} now"
        for what, before, now in (
            ("version", then.version, info.version),
            ("served model", then.served_model, info.served_model),
        )
        if before != now
    ]
    if found:
        raise UsageError(
            f"--resume {resume.path}: the engine that answered is not the one that sweep "
            f"measured ({'; '.join(found)})",
            "resume against the engine and model that sweep measured, or start a new sweep",
        )
