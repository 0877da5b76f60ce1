"""A thin runner for the git CLI: every call in one place, errors as SparkbuildError."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from sparkbuild.errors import GitError

__all__ = ["GitError", "git_env", "run", "text"]

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


def run(
    args: Sequence[str],
    *,
    git_dir: Path | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    command = ["git"]
    if git_dir is not None:
        command += ["--git-dir", str(git_dir)]
    command += list(args)
    result = subprocess.run(
        command, cwd=cwd, env=git_env(env), input=input, capture_output=True, check=False
    )
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
