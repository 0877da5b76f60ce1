"""Global options anywhere: ``--project``, ``--cache-dir``, ``--lock-file``, ``--repo`` and
``--quiet`` after the command too, so every nox session (``sparkbuild CMD ARGS POSARGS``)
passes them through."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import RunCli, every_command
from tests.support.gitrepos import tagged_repo
from tests.support.nox_sessions import nox_sessions

GLOBAL_FLAGS = ("--project", "--cache-dir", "--lock-file", "--repo", "--quiet")

SPEC = """\
engine: sglang
repo: https://example.invalid/not-this-one.git
base_branch: main
package_dir: python/pkg
builds:
  tiny: {ref: v0.1.0}
"""


def test_every_command_takes_the_global_options_after_it() -> None:
    for path, command in every_command().items():
        opts = {opt for param in command.params for opt in param.opts}
        assert set(GLOBAL_FLAGS) <= opts, (path, set(GLOBAL_FLAGS) - opts)


@pytest.fixture
def tiny_project(tmp_path: Path) -> tuple[Path, Path]:
    """A project whose spec names an unreachable repo, and the local upstream to use instead."""
    upstream = tmp_path / "upstream"
    (upstream / "python" / "pkg").mkdir(parents=True)
    (upstream / "python" / "pkg" / "__init__.py").write_text("__version__ = '0.1.0'\n")
    tagged_repo(upstream, "v0.1.0", "c0")
    project = tmp_path / "project"
    (project / "builds").mkdir(parents=True)
    (project / "builds" / "tiny.yaml").write_text(SPEC)
    return project, upstream


def test_global_options_after_the_command_act_as_before_it(
    run_cli: RunCli, tiny_project: tuple[Path, Path], tmp_path: Path
) -> None:
    project, upstream = tiny_project
    globals_ = ["--project", str(project), "--cache-dir", str(tmp_path / "cache"), "--quiet"]
    globals_ += ["--repo", f"sglang={upstream}"]
    before = run_cli(*globals_, "patches", "--json", cwd=tmp_path)
    after = run_cli("patches", "--json", *globals_, cwd=tmp_path)
    assert before.exit_code == after.exit_code == 0, after.output
    assert json.loads(after.stdout) == json.loads(before.stdout)
    assert json.loads(after.stdout)["builds"][0]["base_commit"]  # resolved from the local upstream
    assert after.stderr == ""  # --quiet, after the command


@dataclass
class RecordingSession:
    """What a nox session hands to the command line (nox itself would install and run)."""

    posargs: list[str]
    runs: list[tuple[str, ...]] = field(default_factory=list)

    def install(self, *args: str) -> None:
        pass

    def run(self, *args: str, **kwargs: Any) -> None:
        self.runs.append(args)


def test_every_nox_session_passes_global_options_through(
    run_cli: RunCli, tiny_project: tuple[Path, Path], tmp_path: Path
) -> None:
    """`nox -s patches -- --project D --repo E=U` works: run for real (the command line as
    the session builds it), and every other sparkbuild session hands on the same options to
    a command that takes them."""
    project, upstream = tiny_project
    posargs = ["--project", str(project), "--repo", f"sglang={upstream}"]
    posargs += ["--cache-dir", str(tmp_path / "cache")]
    commands = every_command()
    cli_sessions = 0
    for name, func in nox_sessions().items():
        session = RecordingSession(posargs=list(posargs))
        func(session)
        cli_runs = [argv for argv in session.runs if argv[0] == "sparkbuild"]
        if not cli_runs:
            continue  # tests, lint, setup-host: not the command line
        (argv,) = cli_runs
        cli_sessions += 1
        assert argv[-len(posargs) :] == tuple(posargs), name
        opts = {opt for p in commands[argv[1]].params for opt in p.opts}
        assert {"--project", "--repo", "--cache-dir"} <= opts, name
        if name == "patches":
            result = run_cli(*argv[1:], "--json", cwd=tmp_path)
            assert result.exit_code == 0, result.output
            assert json.loads(result.stdout)["builds"][0]["build"] == "tiny"
    assert cli_sessions >= 12
