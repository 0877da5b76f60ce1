"""A thin runner for the git CLI: every call in one place, errors as SparkbuildError."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from sparkbuild.errors import GitError, GitNotFoundError
from sparkbuild.redact import redact

__all__ = ["GitError", "GitNotFoundError", "git_env", "run", "run_with_progress", "text"]

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
        raise _failed(args, result.returncode, result.stderr)
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


_PROGRESS_SPLIT = re.compile(rb"[\r\n]")


def run_with_progress(
    args: Sequence[str],
    *,
    git_dir: Path | None = None,
    input: bytes | None = None,
    on_progress: Callable[[str], None],
) -> subprocess.CompletedProcess[bytes]:
    """Like :func:`run` (``check``), for a command started with ``--progress``: each progress
    line git writes to stderr (``Receiving objects:  42% (...)``) goes to ``on_progress`` as
    it arrives; all of stderr is still returned (and parsed on failure)."""
    command = ["git", *(["--git-dir", str(git_dir)] if git_dir is not None else []), *args]
    process = subprocess.Popen(
        command,
        env=git_env(),
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    out = bytearray()
    # stdin and stdout are drained beside the stderr loop, so no pipe can fill and block git.
    feeders = [threading.Thread(target=_drain, args=(process.stdout, out), daemon=True)]
    if input is not None:
        feeders.append(threading.Thread(target=_feed, args=(process, input), daemon=True))
    for feeder in feeders:
        feeder.start()
    err = bytearray()
    pending = b""
    while chunk := os.read(process.stderr.fileno(), 65536):
        err += chunk
        *lines, pending = _PROGRESS_SPLIT.split(pending + chunk)
        for line in lines:
            if line.strip():
                on_progress(line.decode(errors="replace").strip())
    returncode = process.wait()
    for feeder in feeders:
        feeder.join()
    if returncode != 0:
        raise _failed(args, returncode, bytes(err))
    return subprocess.CompletedProcess(command, returncode, bytes(out), bytes(err))


def _failed(args: Sequence[str], returncode: int, stderr: bytes) -> GitError:
    """The command and git's reason, with URL credentials redacted."""
    said = redact(stderr.decode(errors="replace").strip())
    return GitError.failed([redact(arg) for arg in args], returncode, said)


def _drain(stream: BinaryIO, into: bytearray) -> None:
    while chunk := stream.read(65536):
        into += chunk


def _feed(process: subprocess.Popen[bytes], data: bytes) -> None:
    assert process.stdin is not None
    try:
        process.stdin.write(data)
        process.stdin.close()
    except BrokenPipeError:  # git stopped reading (it failed); its stderr says why
        pass
