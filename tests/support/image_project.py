"""Helpers for image-stage tests: a project directory with a spec, patches made with git,
and the real `sparkbuild` CLI run on it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.support.cli import CliResult, run_cli
from tests.support.gitrepos import Edit, make_patch


def make_patch_file(repo: Path | str, ref: str, edits: Mapping[str, Edit], dest: Path) -> Path:
    """:func:`tests.support.gitrepos.make_patch` written to ``dest`` (specs name patch files)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(make_patch(repo, ref, edits))
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
