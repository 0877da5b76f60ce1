"""The ``sparkbuild`` command line: the group and global options in ``main``, shared options
in ``options``, per-build runs in ``output``, one module per stage's commands."""

from sparkbuild.cli.main import COMMAND_MODULES, main, render_error
from sparkbuild.cli.output import run_per_build
from sparkbuild.outputs import check_directory, check_writable, emit_json

__all__ = [
    "COMMAND_MODULES",
    "check_directory",
    "check_writable",
    "emit_json",
    "main",
    "render_error",
    "run_per_build",
]
