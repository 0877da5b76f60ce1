"""The ``sparkbuild`` command line: global options here, one module per stage's commands."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import click

from sparkbuild import __version__, console
from sparkbuild.errors import SparkbuildError
from sparkbuild.settings import Settings, default_cache_dir, parse_repo_overrides

if TYPE_CHECKING:  # the spec module (pydantic) loads only with the commands that need it
    from sparkbuild.spec import Build


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
            return super().invoke(ctx)
        except SparkbuildError as exc:
            console.err.print(f"error: {exc.message}", style="red", markup=False)
            if exc.hint:
                console.err.print(f"hint: {exc.hint}", markup=False)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            console.err.print("interrupted", markup=False)
            ctx.exit(130)


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
    try:
        overrides = parse_repo_overrides(repos)
    except SparkbuildError as exc:
        raise click.UsageError(str(exc)) from exc
    ctx.obj = Settings(
        project_dir=project_dir.resolve(),
        cache_dir=(cache_dir or default_cache_dir()).expanduser().resolve(),
        lock_path=lock_file.resolve() if lock_file else None,
        repo_overrides=overrides,
        quiet=quiet,
    )


def emit_json(payload: Any, path: str | None = None) -> None:
    """JSON for scripts: to stdout, or to ``path`` when a command takes ``--json FILE``."""
    text = json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n"
    if path is None or path == "-":
        sys.stdout.write(text)
    else:
        Path(path).write_text(text, encoding="utf-8")


class _Reportable(Protocol):
    def to_json(self) -> dict[str, Any]: ...


Result = TypeVar("Result", bound=_Reportable)


def run_per_build(
    builds: Sequence[Build],
    action: Callable[[Build], Result],
    *,
    summary: Callable[[Result], str],
    as_json: bool,
    noun: str,
) -> list[Result]:
    """Run ``action`` on each build; one failure does not stop the others.

    A single build's error propagates as is; with several, each is printed, all results
    (and failures) go to JSON, and the command fails at the end naming the failed builds.
    """
    results: list[Result] = []
    failures: list[tuple[str, SparkbuildError]] = []
    for build in builds:
        try:
            result = action(build)
        except SparkbuildError as exc:
            if len(builds) == 1:
                raise
            failures.append((build.name, exc))
            console.err.print(f"error: {exc}", style="red", markup=False)
            continue
        results.append(result)
        if not as_json:
            console.out.print(summary(result), markup=False)
    if as_json:
        emit_json(
            {
                "results": [r.to_json() for r in results],
                "failed": [{"build": n, "error": e.message, "hint": e.hint} for n, e in failures],
            }
        )
    if failures:
        names = ", ".join(name for name, _ in failures)
        raise SparkbuildError(f"{len(failures)} of {len(builds)} {noun} failed: {names}")
    return results


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
    "preflight": "preflight",
}
