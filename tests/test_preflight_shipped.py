"""Preflight of the shipped SGLang builds, every profile each lists, in local venvs.

The shipped ``builds/sglang.yaml`` and ``smoke/`` profiles, prepared by the real source stage
from a git repository of the real releases (PR #24436 from its stand-in, see
tests/support/pr_standins.py), each build in a venv with its release's own dependencies and
its ``requirements:`` pins. This is the gate the content must pass before any GPU: a failure
here prints every check's cause and fix. A check that needs a CUDA-only package (a changed
module importing sgl_kernel, say) is a skip naming it: only the image run can pass it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.pr_standins import push_gemma4_mtp_pr
from tests.support.preflight_env import ROOT, Project, release_repo

# Each build's probe runs SGLang's own Python in a venv of the release's dependencies.
pytestmark = [pytest.mark.upstream, pytest.mark.engine]

SHIPPED = yaml.safe_load((ROOT / "builds" / "sglang.yaml").read_text())["builds"]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    base = tmp_path_factory.mktemp("shipped")
    repo = base / "sglang.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(release_repo()), str(repo)], check=True)
    push_gemma4_mtp_pr(repo, base / "work")
    project = Project(base / "project", base / "cache")
    (project.path / "builds" / "sglang.yaml").write_text(
        (ROOT / "builds" / "sglang.yaml").read_text()
    )
    project.settings = type(project.settings)(
        project_dir=project.path,
        cache_dir=base / "cache",
        repo_overrides={"sglang": str(repo)},
        quiet=True,
    )
    return project


@pytest.mark.parametrize("build", sorted(SHIPPED))
def test_shipped_build_passes_preflight(project: Project, build: str) -> None:
    profiles = list(SHIPPED[build].get("smoke", []))
    report = project.preflight(build, profiles)
    assert [p.profile for p in report.profiles] == profiles
    assert report.verdict != "fail", "\n".join(report.failures())
    checks = [*report.package_checks, *(c for p in report.profiles for c in p.checks)]
    assert {c.name for c in checks} == {
        "compile",
        "imports",
        "registry",
        "signals",
        "flags",
        "env",
        "config",
    }
    # A skip is honest only when it names what this CPU cannot have: a CUDA-only package
    # or the engine's own GPU-platform check (the image on a GPU host has both).
    reasons = ("installable on this CPU", "installed on this CPU", "checks the GPU platform")
    for check in checks:
        if check.status == "skip":
            assert any(reason in check.detail for reason in reasons), check.detail
    assert report.dependencies["unavailable"] == []


def test_lock_records_the_verdict_by_tree_and_dependencies(project: Project) -> None:
    from sparkbuild import lockfile
    from sparkbuild.preflight import record

    build = "sglang-0.5.23-spark"
    report = project.preflight(build, [], checks=("compile", "signals"))
    record(project.settings, report)
    entry = lockfile.load(project.settings.lock_file).to_json()["builds"][build]["preflight"]
    assert list(entry) == [f"{report.tree}+{report.deps_digest}"]
    value = entry[report.key]
    assert value["where"] == "venv" and value["checks"]["signals"] == "pass"
    assert Path(report.dependencies["venv"]).is_dir()
