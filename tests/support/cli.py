"""The one way tests start the sparkbuild command line (the `run_cli` fixture in conftest.py).

In-process (the default) runs click's entry point under CliRunner: fast, and what almost
every test wants. ``process=True`` starts the installed ``sparkbuild`` console script as its
own process, for tests whose point is a process of its own: engines it spawns and must reap,
a SIGKILL mid-boot, a nice'd CLI beside a load, docker and BuildKit children writing to the
CLI's own file descriptors.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import click
from click.testing import CliRunner

from sparkbuild.cli import main


@dataclass(frozen=True)
class CliResult:
    """What a user would see: exit code, stdout, stderr (``output``: both, as a terminal)."""

    exit_code: int
    stdout: str
    stderr: str
    output: str
    exception: BaseException | None = None


class RunCli(Protocol):
    def __call__(
        self,
        *args: str,
        cwd: Path | None = None,
        input: str | None = None,
        env: Mapping[str, str | None] | None = None,
        process: bool = False,
        timeout: float = 900,
    ) -> CliResult: ...


def installed_entry_point() -> str:
    """The `sparkbuild` console script of the environment running the tests."""
    script = Path(sys.executable).parent / "sparkbuild"
    if not script.exists():
        raise AssertionError(f"{script} is missing: pip install -e '.[test]' installs it")
    return str(script)


def run_cli(
    *args: str,
    cwd: Path | None = None,
    input: str | None = None,
    env: Mapping[str, str | None] | None = None,
    process: bool = False,
    timeout: float = 900,
) -> CliResult:
    """``sparkbuild ARGS``; ``env`` adds variables (None removes one)."""
    if process:
        return _in_a_process(args, cwd, input, env, timeout)
    with _working_directory(cwd):
        result = CliRunner(env=env).invoke(main, list(args), input=input, catch_exceptions=False)
    return CliResult(
        result.exit_code, result.stdout, result.stderr, result.output, result.exception
    )


def _in_a_process(
    args: tuple[str, ...],
    cwd: Path | None,
    input: str | None,
    env: Mapping[str, str | None] | None,
    timeout: float,
) -> CliResult:
    environ = dict(os.environ)
    for name, value in (env or {}).items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    done = subprocess.run(
        [installed_entry_point(), *args],
        cwd=cwd,
        env=environ,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return CliResult(done.returncode, done.stdout, done.stderr, done.stdout + done.stderr)


@contextlib.contextmanager
def _working_directory(cwd: Path | None) -> Iterator[None]:
    if cwd is None:
        yield
        return
    before = Path.cwd()
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(before)


def every_command() -> dict[str, click.Command]:
    """Every command and subcommand of the command line by its path, e.g. ``bench compare``."""
    found: dict[str, click.Command] = {}
    context = click.Context(main)
    for name in main.list_commands(context):
        command = main.get_command(context, name)
        assert command is not None
        found[name] = command
        if isinstance(command, click.Group):
            found |= {f"{name} {sub}": c for sub, c in command.commands.items()}
    return found
