"""Where a run's results go: JSON for scripts (stdout or a file), and the checks, made before
a long run, that an output file or directory can be written. Shared by the commands and by
the stages that write their own outputs (bench)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sparkbuild import fileio, jsontext
from sparkbuild.errors import UsageError
from sparkbuild.redact import redact


def emit_json(payload: object, path: str | None = None, *, option: str = "--json-file") -> None:
    """JSON for scripts: to stdout (``--json``: no path, or ``-``), else to the file ``path``
    (``option`` names where it came from, for the error)."""
    # jsontext: a non-finite figure is written as null, never as NaN or Infinity (not JSON)
    text = redact(jsontext.dumps(payload, indent=2, sort_keys=True, default=str)) + "\n"
    if path is None or path == "-":
        sys.stdout.write(text)
        return
    try:
        fileio.write_atomic(Path(path), text)
    except OSError as exc:
        raise UsageError(
            f"{option} {path}: cannot write: {exc.strerror or exc}",
            f"pass a writable path to {option}",
        ) from exc


def check_writable(path: str | Path | None, option: str) -> None:
    """Fail before a long run, not after it, when its output file cannot be written."""
    if path is None or str(path) == "-":
        return
    target = Path(path)
    problem = None
    try:
        if target.is_dir():
            problem = "is a directory"
        elif target.exists() and not os.access(target, os.W_OK):
            problem = "is not writable"
        elif not target.exists():
            parent = target.parent if str(target.parent) else Path(".")
            if not parent.is_dir():
                problem = f"directory {parent} does not exist"
            elif not os.access(parent, os.W_OK):
                problem = f"directory {parent} is not writable"
    except OSError as exc:  # a name too long, a symlink loop
        problem = exc.strerror or str(exc)
    if problem:
        raise UsageError(f"{option} {target}: {problem}", f"pass a writable path to {option}")


def check_directory(path: str | Path | None, option: str) -> None:
    """Fail before the work when the directory ``path`` cannot be made or written: it is a
    file, or its nearest existing parent is not a writable directory."""
    if path is None:
        return
    target = Path(path).absolute()
    problem = None
    try:
        if target.exists() and not target.is_dir():
            problem = "is a file, not a directory"
        else:
            existing = next(p for p in (target, *target.parents) if p.exists())
            if not existing.is_dir():
                problem = f"{existing} is a file, not a directory"
            elif not os.access(existing, os.W_OK | os.X_OK):
                problem = f"directory {existing} is not writable"
    except OSError as exc:  # a name too long, a symlink loop
        problem = exc.strerror or str(exc)
    if problem:
        raise UsageError(f"{option} {path}: {problem}", f"pass a writable directory to {option}")
