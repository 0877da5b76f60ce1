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
from typing import Any

import pytest
import yaml

from sparkbuild.preflight.where import build_pins
from sparkbuild.spec import load_builds
from tests.support.pr_standins import (
    FROZEN_KV_MTP_UTILS,
    push_gemma4_mtp_pr,
    push_kernel_import_variant,
)
from tests.support.preflight_env import ROOT, Project, release_repo

# Each build's probe runs SGLang's own Python in a venv of the release's dependencies.
# spread: each build's preflight is minutes of one core, and its venvs are shared on disk
# (under a file lock), so the builds may run on different workers.
pytestmark = [pytest.mark.upstream, pytest.mark.engine, pytest.mark.spread]

SHIPPED = yaml.safe_load((ROOT / "builds" / "sglang.yaml").read_text())["builds"]


@pytest.fixture(scope="module")
def shipped_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The release repository with the PR #24436 stand-in (its clone in ``work``)."""
    base = tmp_path_factory.mktemp("shipped")
    repo = base / "sglang.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(release_repo()), str(repo)], check=True)
    push_gemma4_mtp_pr(repo, base / "work")
    return base


@pytest.fixture(scope="module")
def project(shipped_base: Path) -> Project:
    base = shipped_base
    repo = base / "sglang.git"
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
    # Decided: kernel packages stand in by their real Python, the platform by a GB10's
    # answers, so no check is left to the image on a GPU host.
    skipped = [f"{c.name}: {c.detail}" for c in checks if c.status == "skip"]
    assert skipped == []
    assert report.verdict == "pass"
    assert report.dependencies["unavailable"] == []
    assert report.dependencies["standins"]["missing"] == []
    _assert_pins_are_a_layer_that_wins(project, build, report.dependencies)


def _assert_pins_are_a_layer_that_wins(project: Project, build: str, deps: dict[str, Any]) -> None:
    """A build's pins are a layer over its release's venv (shared by the release's builds),
    and in that layer the pin, not the release's version, is what imports."""
    pins = build_pins(load_builds(project.settings)[build])
    assert ("venv_layer_over" in deps) == bool(pins), deps.get("venv_layer_over")
    for pin in pins:
        name, _, version = pin.partition("==")
        code = f"import importlib.metadata as m; print(m.version({name!r}))"
        python = Path(deps["venv"]) / "bin" / "python"
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
        assert done.stdout.strip() == version, (pin, done.stdout)


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


# One more name than the stand-in imports, absent from 0.5.11's pinned sglang-kernel. The
# passing case (a name the pinned package has) is the shipped builds above: SGLang's own
# modules import hundreds of names from sgl_kernel and pass, and
# tests/test_preflight_standins.py holds the stand-in against the real wheel.
@pytest.mark.parametrize(("name", "present"), [("top_k_top_p_sampling_from_probs", False)])
def test_pr_kernel_import_is_checked_against_the_pinned_kernel_package(
    shipped_base: Path, name: str, present: bool
) -> None:
    """The PR stand-in on 0.5.11, its Frozen-KV MTP utils importing one more name from
    sgl_kernel under ``is_cuda()``: sglang-kernel 0.4.2 (0.5.11's pin) has segment_packbits;
    top_k_top_p_sampling_from_probs came in a later sglang-kernel (0.4.10 has it)."""
    number = 90001 if present else 90002
    push_kernel_import_variant(shipped_base / "sglang.git", shipped_base / "work", number, name)
    project = Project(shipped_base / f"variant-{number}", shipped_base / "cache")
    project.settings = type(project.settings)(
        project_dir=project.path,
        cache_dir=shipped_base / "cache",
        repo_overrides={"sglang": str(shipped_base / "sglang.git")},
        quiet=True,
    )
    project.write_builds({"variant": {"ref": "v0.5.11", "prs": [{"number": number}]}})
    report = project.preflight("variant", [], checks=("compile", "imports"))
    imports = next(c for c in report.package_checks if c.name == "imports")
    module = "sglang.srt.speculative.frozen_kv_mtp_utils"
    item = next(i for i in imports.items if i["module"] == module)
    assert item["role"] == "changed" and FROZEN_KV_MTP_UTILS.endswith("frozen_kv_mtp_utils.py")
    if present:
        assert imports.status == "pass", imports.detail
        assert item["ok"]
    else:
        assert imports.status == "fail"
        assert (
            f"{module} imports name {name!r} that sgl_kernel (sglang-kernel 0.4.2) does not have"
            in imports.detail
        )
