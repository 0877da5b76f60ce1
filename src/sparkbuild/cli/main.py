"""The ``sparkbuild`` command group: global options, lazy loading of each stage's commands,
and the one path by which an error reaches the user."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sparkbuild import __version__, console, interrupts
from sparkbuild.errors import (
    EXIT_FAILURE,
    FileSystemError,
    InternalError,
    SparkbuildError,
    UsageError,
)
from sparkbuild.settings import Settings, default_cache_dir, parse_repo_overrides
from sparkbuild.validate import redact_url

if TYPE_CHECKING:  # the spec module (pydantic) loads only with the commands that need it
    pass


class _Group(click.Group):
    """Loads stage commands on demand and turns SparkbuildError into a message and an exit
    status instead of a traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(COMMAND_MODULES))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            module = importlib.import_module(f"sparkbuild.cli.{COMMAND_MODULES[cmd_name]}")
            self.commands.update({c.name or "": c for c in module.COMMANDS})
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with interrupts.signals_interrupt():
                return super().invoke(ctx)
        except SparkbuildError as exc:
            render_error(exc)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            console.err.print("interrupted", markup=False)
            ctx.exit(130)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except OSError as exc:  # the disk, not sparkbuild: one screen naming the file
            if os.environ.get("SPARKBUILD_DEBUG"):
                raise
            error = file_system_error(exc)
            render_error(error)
            ctx.exit(error.exit_code)
        except Exception as exc:  # a bug: still one screen, with the way to see the trace
            if os.environ.get("SPARKBUILD_DEBUG"):
                raise
            render_error(
                InternalError(
                    f"internal error: {type(exc).__name__}: {exc}",
                    "this is a sparkbuild bug; re-run with SPARKBUILD_DEBUG=1 for the "
                    "traceback and report it",
                )
            )
            ctx.exit(EXIT_FAILURE)


def file_system_error(exc: OSError) -> FileSystemError:
    """What a failed file operation means to the user: the file, why, and what to check."""
    where = " -> ".join(str(name) for name in (exc.filename, exc.filename2) if name)
    return FileSystemError(
        f"{where or 'a file operation'}: {exc.strerror or exc}",
        "check that the disk has space and is writable, and that files and directories are "
        "where sparkbuild expects them (--project, --cache-dir, --lock-file)",
    )


def render_error(exc: SparkbuildError, *, build: str | None = None) -> None:
    """The one way an error reaches the user: ``error:`` and ``hint:`` lines, credentials
    in URLs masked, no markup interpreted. ``build`` names the build it stopped, when a
    command goes on with the others."""
    message = exc.message if build is None else f"{build}: {exc.message}"
    console.err.print(f"error: {redact_url(message)}", style="red", markup=False)
    if exc.hint:
        console.err.print(f"hint: {redact_url(exc.hint)}", markup=False)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sparkbuild")
@click.option(
    "--project",
    "project_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Project directory holding builds/, patches/, smoke/ and images.lock.",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Mirror and download cache [env SPARKBUILD_CACHE_DIR; default ~/.cache/sparkbuild].",
)
@click.option(
    "--lock-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The lock file [default: PROJECT/images.lock].",
)
@click.option(
    "--repo",
    "repos",
    multiple=True,
    metavar="ENGINE=URL",
    help="Fetch ENGINE's source from URL for this run (a mirror or local repository).",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress output.")
@click.pass_context
def main(
    ctx: click.Context,
    project_dir: Path,
    cache_dir: Path | None,
    lock_file: Path | None,
    repos: tuple[str, ...],
    quiet: bool,
) -> None:
    """Reproducible, patched SGLang and vLLM images for NVIDIA DGX Spark."""
    console.set_quiet(quiet)
    overrides = parse_repo_overrides(repos)  # a UsageError: rendered like every other error
    cache = (cache_dir or default_cache_dir()).expanduser().resolve()
    if cache.exists() and not cache.is_dir():
        raise UsageError(
            f"the cache directory {cache} is a file",
            "move the file away, or pass another --cache-dir (or SPARKBUILD_CACHE_DIR)",
        )
    ctx.obj = Settings(
        project_dir=project_dir.resolve(),
        cache_dir=cache,
        lock_path=lock_file.resolve() if lock_file else None,
        repo_overrides=overrides,
        quiet=quiet,
    )


# Command name -> module under sparkbuild.cli. A module is imported only when one of its
# commands runs (or for --help), so `sparkbuild patches` does not pay for the docker SDK.
COMMAND_MODULES: dict[str, str] = {
    "patches": "source_cmds",
    "prepare": "source_cmds",
    "lock": "source_cmds",
    "build": "build",
    "smoke": "smoke",
    "bench": "bench",
    "publish": "publish",
    "rollback": "publish",
    "bump": "bump",
    "releases": "bump",
    "preflight": "preflight",
}
