"""The ``sparkbuild`` command line: the group and global options in ``main``, shared options
in ``options``, shared output helpers in ``output``, one module per stage's commands."""

from sparkbuild.cli.main import COMMAND_MODULES, main, render_error
from sparkbuild.cli.output import check_directory, check_writable, emit_json, run_per_build

__all__ = [
    "COMMAND_MODULES",
    "check_directory",
    "check_writable",
    "emit_json",
    "main",
    "render_error",
    "run_per_build",
]
