"""The ``sparkbuild`` command group: global options, lazy loading of each stage's commands,
and the one path by which an error reaches the user."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sparkbuild import __version__, console, interrupts, redact, retries
from sparkbuild.errors import (
    EXIT_FAILURE,
    FileSystemError,
    InternalError,
    SparkbuildError,
    UsageError,
)
from sparkbuild.settings import Settings, default_cache_dir, parse_repo_overrides

if TYPE_CHECKING:  # the spec module (pydantic) loads only with the commands that need it
    pass


class _Group(click.Group):
    """Loads stage commands on demand and turns SparkbuildError into a message and an exit
    status instead of a traceback. Click's own usage errors are shown through the console's
    safe stream too: an argument they echo is data, never a terminal command."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.ClickException as exc:
            exc.show(file=console.err_stream)
            raise click.exceptions.Exit(exc.exit_code) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(COMMAND_MODULES))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            module = importlib.import_module(f"sparkbuild.cli.{COMMAND_MODULES[cmd_name]}")
            for command in module.COMMANDS:
                accept_global_options(command)
                self.commands[command.name or ""] = command
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> object:
        try:
            with interrupts.signals_interrupt():
                return super().invoke(ctx)
        except SparkbuildError as exc:
            render_error(exc)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            console.err.print("interrupted", markup=False)
            ctx.exit(130)
        except click.ClickException as exc:
            exc.show(file=console.err_stream)
            ctx.exit(exc.exit_code)
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except OSError as exc:  # the disk, not sparkbuild: one screen naming the file
            if os.environ.get("SPARKBUILD_DEBUG"):
                raise
            error = _docker_error(exc) or file_system_error(exc)
            render_error(error)
            ctx.exit(error.exit_code)
        except Exception as exc:  # a bug: still one screen, with the way to see the trace
            if os.environ.get("SPARKBUILD_DEBUG"):
                raise
            mapped = _docker_error(exc)
            if mapped is not None:
                render_error(mapped)
                ctx.exit(mapped.exit_code)
            render_error(
                InternalError(
                    f"internal error: {type(exc).__name__}: {exc}",
                    "this is a sparkbuild bug; re-run with SPARKBUILD_DEBUG=1 for the "
                    "traceback and report it",
                )
            )
            ctx.exit(EXIT_FAILURE)


def _docker_error(exc: Exception) -> SparkbuildError | None:
    """A docker SDK failure no caller mapped (its APIError is an OSError), as the one
    mapping says (``dockerhost.api_error``); None for anything else. The SDK is looked up,
    not imported: a command that never loaded it cannot have raised its errors."""
    errors = sys.modules.get("docker.errors")
    if errors is None or not isinstance(exc, errors.DockerException):
        return None
    from sparkbuild import dockerhost

    return dockerhost.api_error(exc)


def file_system_error(exc: OSError) -> FileSystemError:
    """What a failed file operation means to the user: the file, why, and what to check."""
    where = " -> ".join(str(name) for name in (exc.filename, exc.filename2) if name)
    return FileSystemError(
        f"{where or 'a file operation'}: {exc.strerror or exc}",
        "check that the disk has space and is writable, and that files and directories are "
        "where sparkbuild expects them (--project, --cache-dir, --lock-file)",
    )


def render_error(exc: SparkbuildError, *, build: str | None = None, hint: bool = True) -> None:
    """The one way an error reaches the user: ``error:`` and ``hint:`` lines, no markup
    interpreted, and (as everything the console prints) secrets masked and control
    characters escaped. ``build`` names the build it stopped, when a command goes on with
    the others (unless the message already starts with its name); ``hint`` off leaves out
    a hint already given for an earlier build."""
    message = exc.message
    if build is not None and not message.startswith(f"{build}: "):
        message = f"{build}: {message}"
    console.err.print(f"error: {message}", style="red", markup=False)
    if exc.hint and hint:
        console.err.print(f"hint: {exc.hint}", markup=False)


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
    """Reproducible, patched SGLang and vLLM images for NVIDIA DGX Spark.

    The options below may also follow the command (`sparkbuild smoke --quiet ...`).
    """
    console.set_quiet(quiet)
    redact.forget_all()  # a new command: only its own secrets are remembered
    retries.forget_unreachable()  # and asks every host again
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


def _late_global(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """A global option given after the command (``sparkbuild smoke --quiet``, or a nox
    session's ``-- --project D``): it changes this run's Settings as if given before it."""
    if value in (None, False, ()):
        return
    root = ctx.find_root()
    settings: Settings = root.obj
    name = param.name
    if name == "quiet":
        console.set_quiet(True)
        settings = replace(settings, quiet=True)
    elif name == "project_dir":
        settings = replace(settings, project_dir=Path(value).resolve())
    elif name == "cache_dir":
        settings = replace(settings, cache_dir=Path(value).expanduser().resolve())
    elif name == "lock_file":
        settings = replace(settings, lock_path=Path(value).resolve())
    elif name == "repos":
        overrides = settings.repo_overrides | parse_repo_overrides(value)
        settings = replace(settings, repo_overrides=overrides)
    context: click.Context | None = ctx
    while context is not None:  # each context copied the object when it was made
        context.obj = settings
        context = context.parent


def accept_global_options(command: click.Command) -> None:
    """Give ``command`` (and a group's subcommands) the group's options, hidden from its
    --help: the group's own --help says they may come after the command too."""
    taken = {opt for param in command.params for opt in param.opts}
    for option in main.params:
        if (
            isinstance(option, click.Option)
            and option.name != "version"
            and not (taken & set(option.opts))
        ):
            late = click.Option(
                option.opts,
                is_flag=option.is_flag,
                multiple=option.multiple,
                type=option.type,
                expose_value=False,
                hidden=True,
                callback=_late_global,
            )
            late.name = option.name
            command.params.append(late)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            accept_global_options(sub)


# Command name -> module under sparkbuild.cli. A module is imported only when one of its
# commands runs (or for --help), so `sparkbuild patches` does not pay for the docker SDK.
COMMAND_MODULES: dict[str, str] = {
    "patches": "source_cmds",
    "prepare": "source_cmds",
    "lock": "source_cmds",
    "build": "build",
    "audit": "audit",
    "smoke": "smoke",
    "bench": "bench",
    "publish": "publish",
    "rollback": "publish",
    "bump": "bump",
    "releases": "bump",
    "preflight": "preflight",
    "profile": "profile",
    "report": "report",
    "verify": "verify",
    "keys": "verify",
}
