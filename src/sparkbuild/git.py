"""A thin runner for the git CLI: every call in one place, errors as SparkbuildError."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from sparkbuild.errors import GitError, GitNotFoundError

__all__ = ["GitError", "GitNotFoundError", "git_env", "run", "text"]

# Deterministic identity for the commits sparkbuild writes into its own scratch history.
_IDENTITY = {
    "GIT_AUTHOR_NAME": "sparkbuild",
    "GIT_AUTHOR_EMAIL": "sparkbuild@localhost",
    "GIT_COMMITTER_NAME": "sparkbuild",
    "GIT_COMMITTER_EMAIL": "sparkbuild@localhost",
}


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(_IDENTITY)
    env["GIT_TERMINAL_PROMPT"] = "0"  # never hang on a credential prompt
    env["LC_ALL"] = "C"  # error texts are parsed in English
    if extra:
        env.update(extra)
    return env


_NO_GIT_HINT = "install git (e.g. `apt-get install git`) and make sure `git --version` works"
_VERSION = re.compile(r"^git version \d+\.\d+")


def _checked_git() -> str:
    """The git on PATH, once it has said it is git: a missing one, or a program named git
    that prints something else, is a GitNotFoundError, not a mystery three calls later."""
    found = shutil.which("git")
    if found is None:
        raise GitNotFoundError("git is not on PATH", _NO_GIT_HINT)
    return _identified(found)


@functools.cache
def _identified(path: str) -> str:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GitNotFoundError(f"cannot run {path}: {exc}", _NO_GIT_HINT) from exc
    said = done.stdout.decode(errors="replace").strip()
    if done.returncode != 0 or not _VERSION.match(said):
        shown = " ".join(said.split())[:80] or "nothing"
        raise GitNotFoundError(
            f"{path} is not git: `git --version` printed {shown!r}",
            f"put a real git first on PATH; {_NO_GIT_HINT}",
        )
    return path


def run(
    args: Sequence[str],
    *,
    git_dir: Path | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    command = [_checked_git()]
    if git_dir is not None:
        command += ["--git-dir", str(git_dir)]
    command += list(args)
    try:
        result = subprocess.run(
            command, cwd=cwd, env=git_env(env), input=input, capture_output=True, check=False
        )
    except OSError as exc:  # removed or made unrunnable since it was identified
        raise GitNotFoundError(f"cannot run git: {exc.strerror or exc}", _NO_GIT_HINT) from exc
    if check and result.returncode != 0:
        raise GitError(args, result.returncode, result.stderr.decode(errors="replace"))
    return result


def text(
    args: Sequence[str],
    *,
    git_dir: Path | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """stdout of a git command, stripped."""
    return run(args, git_dir=git_dir, cwd=cwd, env=env).stdout.decode(errors="replace").strip()
