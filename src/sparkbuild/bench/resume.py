"""``bench --resume FILE``: finish a sweep an earlier run left incomplete.

A sweep writes its report to its ``--json-file`` after every finished cell (atomically: a
temporary file beside it, renamed over it), so an interrupted sweep (Ctrl-C, a killed
process, a dead engine) keeps every finished cell there. ``--resume FILE`` reads that
report, takes its grid (cells, runs, seed, prefix caching, order) and reruns only the cells
it lacks; the finished ones are carried into the new report as they were measured.

A resumed sweep measures the same engine or nothing: before the boot its profile, model,
serve flags, environment and target are held against the earlier run's, and after the
engine answers its version; any difference is refused, naming it. The prompts are the ones
the whole sweep would have sent (each cell's requests keep their numbers), so a resumed
report and an uninterrupted one hold the same cells.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkbuild.bench.results import BenchReport, CellResult, Resumed
from sparkbuild.bench.runner import BenchPlan, SweepSettings
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


def load_resume(path: Path) -> Resume:
    """The report at ``path``, if a sweep can continue from it."""
    from sparkbuild.bench.report import load_report

    earlier = load_report(path)
    if earlier.harness.name != "sparkbuild-bench":
        raise UsageError(
            f"--resume {path}: a {earlier.harness.name} report: only a sparkbuild bench "
            "report says how its engine ran"
        )
    if earlier.complete and not earlier.pending_cells:
        raise UsageError(
            f"--resume {path}: its sweep is complete ({len(earlier.cells)} cells); nothing to "
            "resume",
            "run bench without --resume for a new sweep",
        )
    return Resume(path, earlier)


def _shown(value: object) -> str:
    return redact(json.dumps(value, sort_keys=True, default=str))


def _flag_difference(before: Sequence[str], now: Sequence[str]) -> str:
    gone = [w for w in before if w not in now]
    added = [w for w in now if w not in before]
    parts = ([f"without {' '.join(gone)}"] if gone else []) + (
        [f"with {' '.join(added)}"] if added else []
    )
    return "; ".join(parts) or f"in another order ({' '.join(now)})"


def differences(resume: Resume, plan: BenchPlan, target: Mapping[str, str | None]) -> list[str]:
    """Every engine setting of ``plan`` (and its ``target``: kind, value, image id) that
    differs from the earlier run's."""
    earlier = resume.earlier
    engine = earlier.engine
    found: list[str] = []
    if (plan.profile or None) != (earlier.profile or None):
        found.append(f"profile: {earlier.profile} then, {plan.profile} now")
    if plan.model != engine.model:
        found.append(f"model: {engine.model} then, {plan.model} now")
    # A report keeps secrets masked (redact.secret_args, secret_env): compared as kept.
    args, then_args = secret_args(plan.args), secret_args(engine.args)
    if _shown(args) != _shown(then_args):
        found.append(f"serve flags: {_flag_difference(then_args, args)}")
    env, then_env = secret_env(plan.env), secret_env(engine.env)
    if _shown(env) != _shown(then_env):
        names = sorted(
            set(then_env) ^ set(env)
            | {k for k in set(then_env) & set(env) if _shown(then_env[k]) != _shown(env[k])}
        )
        found.append(f"environment: {', '.join(names)}")
    then = earlier.target
    if target.get("kind") != then.kind:
        found.append(f"target: {then.kind} then, {target.get('kind')} now")
    elif target.get("kind") == "image" and target.get("value") != then.value:
        found.append(f"image: {then.value} then, {target.get('value')} now")
    image_id = target.get("image_id")
    if image_id and then.image_id and image_id != then.image_id:
        found.append(f"image id: {then.image_id[:19]} then, {image_id[:19]} now")
    return found


def check_same_engine(resume: Resume, plan: BenchPlan, target: Mapping[str, str | None]) -> None:
    """Refuse, before the boot, a resumed sweep of another engine, naming each difference."""
    found = differences(resume, plan, target)
    if found:
        raise UsageError(
            f"--resume {resume.path}: this run's engine differs from that sweep's ("
            + "; ".join(found)
            + "): a resumed sweep must measure the same engine",
            "launch it as that run did, or start a new sweep without --resume",
        )


def check_same_version(resume: Resume, version: str | None) -> None:
    """Refuse, once the engine answers, a resumed sweep of another engine release."""
    then = resume.earlier.engine.version
    if then and version and then != version:
        raise UsageError(
            f"--resume {resume.path}: the engine is {version}, that sweep ran {then}",
            "resume against the release that sweep measured, or start a new sweep",
        )
