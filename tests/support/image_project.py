"""Helpers for image-stage tests: a project directory with a spec, patches made with git,
and the real `sparkbuild` CLI run on it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support.cli import CliResult, run_cli

GIT_ENV = {
    "GIT_AUTHOR_NAME": "sparkbuild-tests",
    "GIT_AUTHOR_EMAIL": "tests@sparkbuild.invalid",
    "GIT_COMMITTER_NAME": "sparkbuild-tests",
    "GIT_COMMITTER_EMAIL": "tests@sparkbuild.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


def git(*args: str, cwd: Path | None = None, git_dir: Path | None = None) -> str:
    cmd = ["git"] + ([f"--git-dir={git_dir}"] if git_dir else []) + list(args)
    result = subprocess.run(
        cmd, cwd=cwd, env={**os.environ, **GIT_ENV}, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{result.stdout}{result.stderr}")
    return result.stdout.strip()


def make_patch(repo: Path | str, ref: str, edits: dict[str, str | None], dest: Path) -> Path:
    """A `git diff` patch against `ref` of `repo`: path -> new text (None deletes it).

    Each text value is either the whole new content, or, if it contains a line
    `<<<OLD>>>...<<<NEW>>>...`, a replacement of OLD by NEW in the current content.
    """
    work = dest.parent / (dest.stem + ".work")
    git("clone", "--quiet", "--no-checkout", str(repo), str(work))
    git("checkout", "--quiet", ref, cwd=work)
    for path, edit in edits.items():
        target = work / path
        if edit is None:
            target.unlink()
            continue
        text = edit
        if edit.startswith("<<<OLD>>>"):
            old, new = edit.removeprefix("<<<OLD>>>").split("<<<NEW>>>", 1)
            current = target.read_text()
            if old not in current:
                raise AssertionError(f"{path}: {old!r} not found at {ref}")
            text = current.replace(old, new, 1)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    git("add", "--all", ".", cwd=work)
    diff = git("diff", "--cached", "--binary", cwd=work)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(diff + "\n")
    return dest


def write_spec(project: Path, engine: str, spec: dict[str, Any]) -> Path:
    path = project / "builds" / f"{engine}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"engine": engine, **spec}, sort_keys=False))
    return path


def sparkbuild(
    project: Path, cache: Path, *args: str, env: dict[str, str] | None = None
) -> CliResult:
    """``sparkbuild --project PROJECT --cache-dir CACHE ARGS`` through the one CLI runner."""
    return run_cli("--project", str(project), "--cache-dir", str(cache), *args, env=env)


def build_json(result: CliResult) -> dict[str, Any]:
    if result.exit_code != 0:
        raise AssertionError(f"sparkbuild build failed ({result.exit_code}):\n{result.stderr}")
    payload: dict[str, Any] = json.loads(result.stdout)
    (entry,) = payload["results"]
    return dict(entry)


def load_lock(project: Path) -> dict[str, Any]:
    path = project / "images.lock"
    data: dict[str, Any] = yaml.safe_load(path.read_text()) if path.exists() else {}
    return data
