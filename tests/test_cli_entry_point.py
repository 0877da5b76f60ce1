"""The installed entry points, run as a user runs them: the `sparkbuild` console script and
`python -m sparkbuild`, each in a process of its own.

Every other CLI test goes through the in-process `run_cli` fixture; these check that the
script pip installs and the module entry reach the same command line, with the same exit
status and the same one-screen error.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

from sparkbuild.cli import main
from tests.support.cli import RunCli


def test_console_script_lists_every_command(run_cli: RunCli) -> None:
    result = run_cli("--help", process=True)
    assert result.exit_code == 0, result.output
    listed = result.stdout.split("Commands:", 1)[1]
    for command in main.list_commands(click.Context(main)):
        assert f"\n  {command} " in listed, command


def test_module_entry_point_is_the_same_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sparkbuild", "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: ") and "Commands:" in done.stdout


def test_an_error_exits_the_same_way_in_a_process_and_in_process(
    run_cli: RunCli, tmp_path: Path
) -> None:
    installed = run_cli("--project", str(tmp_path), "patches", process=True)
    in_process = run_cli("--project", str(tmp_path), "patches")
    assert installed.exit_code == in_process.exit_code == 2
    assert installed.stderr == in_process.stderr
    assert installed.stderr.startswith(f"error: no build specs in {tmp_path / 'builds'}")
    assert "Traceback" not in installed.output
