"""A PR's status is decided by the build's tree: PRs that reached ``main`` without a merge
commit of their own (fast-forwarded, or rebased and merged under new SHAs) are applied to a
build older than them and found upstream in a build that holds them (real git repositories)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.gitrepos import Upstream, make_linear_upstream
from tests.support.source_project import SourceProject

SPEC = """\
    engine: sglang
    repo: REPO
    base_branch: main
    package_dir: python/pkg
    prs:
      - {number: 201}
      - {number: 202}
    builds:
      v01: {ref: v0.1.0}
      v02: {ref: v0.2.0}
      v03: {ref: v0.3.0}
"""


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return make_linear_upstream(tmp_path_factory.mktemp("linear"))


@pytest.fixture
def project(tmp_path: Path, upstream: Upstream) -> SourceProject:
    proj = SourceProject.create(tmp_path, upstream)
    proj.write_spec(SPEC)
    return proj


def pr_items(project: SourceProject, build: str) -> dict[str, dict[str, Any]]:
    result = project.run("patches", build, "--json")
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.stdout)["builds"]
    return {item["id"]: item for item in entry["items"]}


def prepared(project: SourceProject, build: str, tmp_path: Path) -> Path:
    out = tmp_path / build
    result = project.run("prepare", build, "--out", str(out))
    assert result.exit_code == 0, result.output
    return out / "python" / "pkg"


def test_a_fast_forwarded_pr_is_applied_to_a_build_before_it(
    project: SourceProject, tmp_path: Path
) -> None:
    item = pr_items(project, "v01")["#201"]
    assert item["status"] == "applied", item["detail"]
    assert item["commits"] == [project.upstream.prs[201]]
    assert "on main after the build's commit" in item["detail"]
    assert (
        "alpha line 5 (fixed by #201)"
        in (prepared(project, "v01", tmp_path) / "alpha.py").read_text()
    )


def test_a_fast_forwarded_pr_is_upstream_in_a_build_that_holds_it(project: SourceProject) -> None:
    item = pr_items(project, "v02")["#201"]
    assert item["status"] == "upstream"
    assert item["detail"].startswith("merged: head ")


def test_a_rebase_merged_pr_is_applied_before_and_upstream_after(
    project: SourceProject, tmp_path: Path
) -> None:
    before = pr_items(project, "v02")["#202"]
    assert before["status"] == "applied", before["detail"]
    assert len(before["commits"]) == 2
    beta = (prepared(project, "v02", tmp_path) / "beta.py").read_text()
    assert "beta line 3 (fixed by #202)" in beta and "beta line 4 (fixed by #202)" in beta
    assert (
        "alpha line 20 (main)" not in (prepared(project, "v02", tmp_path) / "alpha.py").read_text()
    )
    after = pr_items(project, "v03")["#202"]
    assert after["status"] == "upstream"
    assert "reverse apply" in after["detail"]


def test_an_older_build_takes_both_linear_prs(project: SourceProject, tmp_path: Path) -> None:
    items = pr_items(project, "v01")
    assert {k: v["status"] for k, v in items.items()} == {"#201": "applied", "#202": "applied"}
    pkg = prepared(project, "v01", tmp_path)
    assert "fixed by #202" in (pkg / "beta.py").read_text()
    assert "__version__ = '0.1.0'" in (pkg / "__init__.py").read_text()
