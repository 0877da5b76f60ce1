"""A sparkbuild project over a test upstream (:func:`tests.support.gitrepos.make_upstream`):
``builds/``, ``patches/pkg/`` and its own cache, with the CLI run on it."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import yaml

from tests.support.cli import CliResult, run_cli
from tests.support.gitrepos import Upstream

# One build of the test upstream's v1.1.0, with a PR and a patch (``REPO``: its URL).
ONE_BUILD_SPEC = """\
    engine: sglang
    repo: REPO
    base_branch: main
    package_dir: python/pkg
    prs:
      - {number: 103}
    patches:
      - {file: patches/pkg/applies.patch}
    builds:
      new:
        ref: v1.1.0
"""


@dataclass
class SourceProject:
    root: Path
    cache: Path
    upstream: Upstream

    @classmethod
    def create(cls, tmp_path: Path, upstream: Upstream) -> Self:
        """An empty project in ``tmp_path/project`` (``patches`` below it is ``patches/pkg``)."""
        root = tmp_path / "project"
        (root / "builds").mkdir(parents=True)
        (root / "patches" / "pkg").mkdir(parents=True)
        return cls(root=root, cache=tmp_path / "cache", upstream=upstream)

    @property
    def patches(self) -> Path:
        return self.root / "patches" / "pkg"

    @property
    def url(self) -> str:
        return self.upstream.url

    @property
    def lock_text(self) -> str:
        return (self.root / "images.lock").read_text()

    @property
    def lock(self) -> dict[str, Any]:
        data: dict[str, Any] = yaml.safe_load(self.lock_text)
        return data

    def run(self, *args: str, input: str | None = None) -> CliResult:
        """``sparkbuild --project ROOT --cache-dir CACHE --quiet ARGS``."""
        root, cache = str(self.root), str(self.cache)
        return run_cli("--project", root, "--cache-dir", cache, "--quiet", *args, input=input)

    def write_spec(self, text: str, repo: str | None = None, name: str = "pkg.yaml") -> Path:
        """``text`` (dedented) as ``builds/NAME``, with REPO replaced by ``repo`` or the
        upstream's URL."""
        spec = textwrap.dedent(text).replace("REPO", repo if repo is not None else self.url)
        path = self.root / "builds" / name
        path.write_text(spec)
        return path
