"""The GitHub Actions workflows: schema-valid, every action pinned by commit, and wired as the
release process needs (tests on PRs, arm64 builds, Spark-gated smoke, GHCR, lock PR)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
SCRIPTS = sorted((ROOT / ".github" / "scripts").glob("*.sh"))
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")
USES_LINE = re.compile(r"^\s*(?:-\s*)?uses:\s*(\S+)\s*(#.*)?$")


def _load(path: Path) -> dict[Any, Any]:
    data: dict[Any, Any] = yaml.safe_load(path.read_text())
    return data


def _workflow(name: str) -> dict[Any, Any]:
    return _load(ROOT / ".github" / "workflows" / name)


def _triggers(workflow: dict[Any, Any]) -> dict[str, Any]:
    # PyYAML reads the bare key `on` as the boolean True (YAML 1.1).
    triggers: dict[str, Any] = workflow["on"] if "on" in workflow else workflow[True]
    return triggers


def _check_jsonschema(*paths: Path) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("check_jsonschema") is None:
        raise AssertionError(
            "check-jsonschema is not installed; `pip install -e '.[test]'` (or "
            "`pip install check-jsonschema`) provides it"
        )
    cmd = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows"]
    return subprocess.run(
        [*cmd, *map(str, paths)], capture_output=True, text=True, timeout=120, check=False
    )


def test_there_are_workflows() -> None:
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "images.yml", "bump.yml"}


def test_workflows_match_the_github_schema() -> None:
    result = _check_jsonschema(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_catches_a_broken_workflow(tmp_path: Path) -> None:
    broken = _workflow("ci.yml")
    del broken["jobs"]["tests"]["runs-on"]
    broken["jobs"]["tests"]["timeout-minutes"] = "an hour"
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump(broken))
    result = _check_jsonschema(path)
    assert result.returncode != 0, result.stdout


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_action_is_pinned_to_a_commit_with_its_version(path: Path) -> None:
    found = 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = USES_LINE.match(line)
        if not match:
            continue
        found += 1
        reference, comment = match.group(1), match.group(2) or ""
        where = f"{path.name}:{number}: {line.strip()}"
        assert not reference.startswith("./") or "@" not in reference, where
        assert PINNED.match(reference), f"not pinned to a 40-hex commit sha: {where}"
        assert re.match(r"#\s*v\d+\.\d+\.\d+$", comment.strip()), f"no '# vX.Y.Z': {where}"
    uses_anywhere = path.read_text().count("uses:")
    assert found == uses_anywhere, f"{path.name}: a `uses:` this test could not parse"


def test_pull_requests_run_the_tests_and_the_lock_check() -> None:
    workflow = _workflow("ci.yml")
    assert "pull_request" in _triggers(workflow)
    runs = [step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]]
    assert "bash .ci/run" in runs
    assert any("nox -s lock -- --check" in run for run in runs)


def test_images_build_on_arm64_smoke_on_a_spark_and_publish_to_ghcr() -> None:
    workflow = _workflow("images.yml")
    triggers = _triggers(workflow)
    assert {"push", "schedule"} <= set(triggers)
    assert triggers["push"]["branches"] == ["main"] and triggers["push"]["tags"]
    jobs = workflow["jobs"]
    assert jobs["build"]["runs-on"] == "ubuntu-24.04-arm"
    spark = jobs["smoke-publish"]
    assert spark["runs-on"] == ["self-hosted", "dgx-spark"]
    assert spark["if"] == "vars.DGX_SPARK_RUNNER == 'true'"
    assert spark["permissions"]["packages"] == "write"
    assert spark["env"]["REGISTRY"] == "${{ needs.plan.outputs.registry }}"
    step_env = next(s["env"] for s in spark["steps"] if "smoke-and-publish.sh" in s.get("run", ""))
    assert step_env["SPARKBUILD_REGISTRY_PASSWORD"] == "${{ secrets.GITHUB_TOKEN }}"
    skipped = jobs["no-spark"]
    assert skipped["if"] == "vars.DGX_SPARK_RUNNER != 'true'"
    assert "skipped: no DGX Spark runner registered" in skipped["steps"][0]["run"]
    pr = jobs["lock-pr"]
    assert pr["needs"] == ["plan", "smoke-publish"]
    creator = next(s for s in pr["steps"] if "create-pull-request" in s.get("uses", ""))
    assert creator["with"]["add-paths"] == "images.lock"
    prune = jobs["kernel-prune"]  # the github-marked tests run here, where GitHub is reachable
    assert any("pytest tests -m github" in step.get("run", "") for step in prune["steps"])


def test_a_weekly_bump_opens_a_pull_request_with_spec_patches_and_lock() -> None:
    workflow = _workflow("bump.yml")
    assert {"schedule", "workflow_dispatch"} <= set(_triggers(workflow))
    assert re.match(r"^\d+ \d+ \* \* [0-6]$", _triggers(workflow)["schedule"][0]["cron"])
    job = workflow["jobs"]["bump"]
    runs = [step.get("run", "") for step in job["steps"]]
    assert any("nox -s releases -- " in run for run in runs)
    assert any('nox -s bump -- "$ENGINE" --to "$TAG" --write' in run for run in runs)
    creator = next(s for s in job["steps"] if "create-pull-request" in s.get("uses", ""))
    assert creator["with"]["add-paths"].split() == ["builds/", "patches/", "images.lock"]
    assert job["permissions"] == {"contents": "write", "pull-requests": "write"}


def test_untrusted_values_reach_shell_only_through_the_environment() -> None:
    """`${{ matrix.* }}` or `${{ github.event.* }}` inside `run:` would be script injection."""
    for path in WORKFLOWS:
        for job in _load(path)["jobs"].values():
            for step in job.get("steps", []):
                run = step.get("run", "")
                assert not re.search(r"\$\{\{\s*(matrix|github\.event|inputs)\.", run), (
                    f"{path.name}: {run}"
                )


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_workflow_scripts_parse(path: Path) -> None:
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "set -uo pipefail" in path.read_text() or "set -euo pipefail" in path.read_text()


def test_ci_runs_lint() -> None:
    workflow = _workflow("ci.yml")
    runs = [step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]]
    assert "nox -s lint" in runs


def _plan_lock_step(tmp_path: Path, event: str, *, with_lock: bool) -> dict[str, str]:
    """Run the images workflow's 'Is there an images.lock yet?' step in bash; its outputs."""
    step = next(
        s for s in _workflow("images.yml")["jobs"]["plan"]["steps"] if s.get("id") == "lock"
    )
    work = tmp_path / f"{event}-{with_lock}"
    work.mkdir()
    if with_lock:
        (work / "images.lock").write_text("schema: 1\nbuilds: {}\n")
    output = work / "github-output"
    output.touch()
    done = subprocess.run(
        ["bash", "-e", "-c", step["run"]],
        cwd=work,
        env={"EVENT": event, "GITHUB_OUTPUT": str(output), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return dict(line.split("=", 1) for line in output.read_text().splitlines())


def test_a_fresh_fork_builds_unlocked_and_gets_a_lock_pull_request(tmp_path: Path) -> None:
    workflow = _workflow("images.yml")
    # No hard-wired --locked: it comes from the plan, only for pushes with a lock.
    assert "LOCKED" not in workflow.get("env", {})
    assert _plan_lock_step(tmp_path, "push", with_lock=False) == {"exists": "false", "locked": ""}
    assert _plan_lock_step(tmp_path, "push", with_lock=True) == {
        "exists": "true",
        "locked": "--locked",
    }
    assert _plan_lock_step(tmp_path, "schedule", with_lock=True) == {"exists": "true"}
    jobs = workflow["jobs"]
    for name in ("build", "smoke-publish"):
        envs = [s.get("env", {}) for s in jobs[name]["steps"]]
        assert {"LOCKED": "${{ needs.plan.outputs.locked }}"}.items() <= next(
            e for e in envs if "LOCKED" in e
        ).items()
    first = jobs["first-lock"]
    assert first["if"] == "needs.plan.outputs.has-lock == 'false'"
    assert any(s.get("run") == "sparkbuild lock" for s in first["steps"])
    creator = next(s for s in first["steps"] if "create-pull-request" in s.get("uses", ""))
    assert creator["with"]["add-paths"] == "images.lock"
    assert first["permissions"] == {"contents": "write", "pull-requests": "write"}


def test_images_fit_their_runners_and_share_a_build_cache() -> None:
    jobs = _workflow("images.yml")["jobs"]
    hosted = jobs["build"]["steps"]
    runs = [step.get("run", "") for step in hosted]
    free = next(i for i, run in enumerate(runs) if "docker system prune" in run)
    build = next(i for i, run in enumerate(runs) if "sparkbuild build" in run)
    assert free < build and "/usr/share/dotnet" in runs[free]
    assert "--cache-to" in runs[build] and "--cache-from" in runs[build]
    assert "--builder sparkbuild" in runs[build]
    assert any("--driver docker-container" in run for run in runs)
    assert jobs["build"]["permissions"]["packages"] == "write"
    spark = jobs["smoke-publish"]["steps"]
    cache = next(s for s in spark if "SPARKBUILD_CACHE_FROM=" in s.get("run", ""))
    publish = next(s for s in spark if "smoke-and-publish.sh" in s.get("run", ""))
    assert spark.index(cache) < spark.index(publish)
    assert "sparkbuild-cache:{build}" in cache["run"]


def test_the_spark_job_signs_with_the_key_secret_else_keyless(tmp_path: Path) -> None:
    """docs/verify.md: the key pair when its secret is set, else keyless through the job's
    OIDC token; the script's own branch is run here with a stub `sparkbuild` on PATH."""
    job = _workflow("images.yml")["jobs"]["smoke-publish"]
    assert job["permissions"]["id-token"] == "write"
    install = next(s for s in job["steps"] if s.get("name") == "Install sparkbuild")
    assert "'.[keyless]'" in install["run"]
    publish = next(s for s in job["steps"] if "smoke-and-publish.sh" in s.get("run", ""))
    assert publish["env"]["SPARKBUILD_SIGNING_KEY"] == "${{ secrets.SPARKBUILD_SIGNING_KEY }}"
    assert publish["env"]["SPARKBUILD_SIGNING_PASSWORD"] == (
        "${{ secrets.SPARKBUILD_SIGNING_PASSWORD }}"
    )
    script = (ROOT / ".github" / "scripts" / "smoke-and-publish.sh").read_text()
    start = script.index("        sign=(--keyless)")
    branch = script[start : script.index("|| failed+=", start)].replace(
        'sparkbuild publish "$build" --registry "$REGISTRY"', 'printf "%s\\n"'
    )
    for key, expected in (("", "--keyless"), ("-----BEGIN ENCRYPTED SIGSTORE", "")):
        shown = subprocess.run(
            ["bash", "-c", branch],
            env={"PATH": "/usr/bin:/bin", "SPARKBUILD_SIGNING_KEY": key},
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        assert shown.stdout.strip() == expected


def test_the_ghcr_namespace_is_the_lowercased_owner(tmp_path: Path) -> None:
    """GHCR refuses uppercase repository names; an owner such as `NVIDIA-AI` must become
    `nvidia-ai` for the pushes and the build cache alike (the step's own shell, run here)."""
    workflow = _workflow("images.yml")
    plan = workflow["jobs"]["plan"]
    assert plan["outputs"]["registry"] == "${{ steps.registry.outputs.registry }}"
    step = next(s for s in plan["steps"] if s.get("id") == "registry")
    assert step["env"]["OWNER"] == "${{ github.repository_owner }}"
    output = tmp_path / "github_output"
    env = {"PATH": "/usr/bin:/bin", "OWNER": "NVIDIA-AI-Spark", "GITHUB_OUTPUT": str(output)}
    subprocess.run(["bash", "-c", step["run"]], env=env, check=True, timeout=30)
    assert output.read_text().strip() == "registry=ghcr.io/nvidia-ai-spark"
    assert "env" not in workflow, "a workflow-level REGISTRY cannot be lowercased"
    text = (ROOT / ".github" / "workflows" / "images.yml").read_text()
    assert text.count("github.repository_owner") == 1, "only the registry step reads the owner"
    cache_refs = re.findall(r"\S*sparkbuild-cache:\{build\}", text)
    assert len(cache_refs) == 2, cache_refs
    assert all("$REGISTRY/sparkbuild-cache" in ref for ref in cache_refs), cache_refs


def _steps(workflow: dict[Any, Any]) -> list[tuple[str, dict[Any, Any]]]:
    return [
        (job_name, step)
        for job_name, job in workflow["jobs"].items()
        for step in job.get("steps") or []
    ]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_no_checkout_keeps_the_job_token(path: Path) -> None:
    checkouts = [
        (job, step)
        for job, step in _steps(_load(path))
        if str(step.get("uses", "")).startswith("actions/checkout@")
    ]
    assert checkouts
    for job, step in checkouts:
        assert (step.get("with") or {}).get("persist-credentials") is False, (
            f"{path.name}: job {job}: actions/checkout must set persist-credentials: false"
        )


def test_actionlint_knows_every_self_hosted_label() -> None:
    """actionlint refuses labels it does not know: its config lists each one the workflows
    use beside `self-hosted` (and `nox -s lint` runs actionlint with it)."""
    config = _load(ROOT / ".github" / "actionlint.yaml")
    known = set(config["self-hosted-runner"]["labels"])
    used = set()
    for path in WORKFLOWS:
        for job in _load(path)["jobs"].values():
            labels = job.get("runs-on")
            if isinstance(labels, list) and "self-hosted" in labels:
                used |= {label for label in labels if label != "self-hosted"}
    assert used and used <= known, f"not in .github/actionlint.yaml: {used - known}"
    noxfile = (ROOT / "noxfile.py").read_text()
    assert 'session.run("zizmor", "--offline", ".github/workflows")' in noxfile
    assert 'session.run("actionlint")' in noxfile


def _inline_python(script: Path) -> str:
    """The Python a workflow script runs from a ``<<'PY'`` heredoc."""
    match = re.search(r"<<'PY'\n(.*?)\nPY\n", script.read_text(), re.DOTALL)
    assert match, f"{script.name}: no <<'PY' heredoc"
    return match.group(1)


def test_smoke_and_publish_reads_the_pinned_image_and_profiles(tmp_path: Path) -> None:
    """The Spark job's script asks the package for each build's pinned image and smoke
    profiles: run its Python on a project whose lock the package wrote (it once imported a
    module since renamed, and every build failed at this step)."""
    from sparkbuild import lockfile

    (tmp_path / "builds").mkdir()
    (tmp_path / "builds" / "pkg.yaml").write_text(
        "engine: sglang\nrepo: https://example.invalid/pkg.git\nbase_branch: main\n"
        "package_dir: python/pkg\nbuilds:\n  pinned: {ref: v1.1.0, smoke: [one, two]}\n"
        "  unbuilt: {ref: v1.1.0, smoke: [one]}\n"
    )
    image_id = "sha256:" + "ab" * 32
    lockfile.set_section(
        tmp_path / "images.lock", "pinned", lockfile.ImageSection(image_id=image_id)
    )
    code = _inline_python(ROOT / ".github" / "scripts" / "smoke-and-publish.sh")

    def run(build: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-c", code, build]
        return subprocess.run(
            cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
        )

    pinned = run("pinned")
    assert pinned.returncode == 0, pinned.stderr
    assert pinned.stdout.split() == [image_id, "one,two"]
    refusals = {build: run(build) for build in ("unbuilt", "absent")}
    for build, refused in refusals.items():
        assert refused.returncode == 1 and refused.stdout == ""
        assert (
            refused.stderr.startswith(f"::error::{build}: ") and "Traceback" not in refused.stderr
        )
    assert "sparkbuild build unbuilt" in refusals["unbuilt"].stderr


def test_the_report_is_built_after_publish_and_served_by_pages() -> None:
    job = _workflow("images.yml")["jobs"]["report"]
    assert job["needs"] == ["plan", "smoke-publish"]
    assert "!cancelled()" in job["if"] and "has-lock == 'true'" in job["if"]
    assert job["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    assert job["environment"]["name"] == "github-pages"
    steps = job["steps"]
    assert steps[0]["with"]["fetch-depth"] == 0, "dates and previous images come from git"
    uses = [s.get("uses", "").split("@")[0] for s in steps]
    lock = uses.index("actions/download-artifact")
    assert steps[lock]["with"]["name"] == "images-lock"
    build = next(i for i, s in enumerate(steps) if "sparkbuild report" in s.get("run", ""))
    out = steps[build]["run"].split("--out", 1)[1].split()[0]
    upload = uses.index("actions/upload-pages-artifact")
    assert lock < build < upload < uses.index("actions/deploy-pages")
    assert steps[upload]["with"]["path"] == out
