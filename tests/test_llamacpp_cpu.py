"""The third engine end to end on a real llama-server: llama.cpp b11434 built for the CPU
(tests/support/llamacpp_cpu.py, once per machine) serving a tiny GGUF Llama that drafts for
itself. Smoke (plain and deep, lossless against a second boot without speculation), bench with
acceptance from the per-response draft counts, the lock and the report, preflight of the
built program, and the failures each check is for, shown on real bad input.

Boots take about a second here; the build is the cost, shared with every other user of the
cache.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkbuild.adapters import adapter_for
from sparkbuild.engines.targets import ProcessTarget, free_port, wait_ready
from tests.support.cli import CliResult, run_cli
from tests.support.gitrepos import tagged_repo
from tests.support.llamacpp_cpu import LLAMA_CPP_BUILD, llama_server, llama_server_dir, tiny_gguf
from tests.support.smoke_cli import SmokeRun, run_smoke_cli

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[1]
BUILD = f"llamacpp-b{LLAMA_CPP_BUILD}-spark"
PROFILE = "llamacpp-cpu-reference"


@pytest.fixture(scope="module")
def server() -> Path:
    return llama_server()


@pytest.fixture(scope="module")
def model() -> Path:
    return tiny_gguf()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, server: Path) -> Path:
    """llama.cpp's repository as far as a build of it reads it here: the release's own
    architecture list, tagged b11434."""
    work = tmp_path_factory.mktemp("llama.cpp")
    (work / "src").mkdir()
    shutil.copy(llama_server_dir() / "src" / "llama-arch.cpp", work / "src" / "llama-arch.cpp")
    tagged_repo(work, f"b{LLAMA_CPP_BUILD}", "the release's tree, as this test needs it")
    return work


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, upstream: Path) -> Path:
    """The shipped llama.cpp spec and profiles, the repo overridden by the local tree, locked;
    the image section stands in for `build` (no CUDA build here)."""
    root = tmp_path_factory.mktemp("project")
    (root / "builds").mkdir()
    spec = yaml.safe_load((ROOT / "builds" / "llamacpp.yaml").read_text())
    spec["repo"] = str(upstream)
    spec["base_branch"] = "main"  # the local tree's branch (upstream's is master)
    (root / "builds" / "llamacpp.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (root / "smoke").mkdir()
    for path in (ROOT / "smoke").glob("llamacpp-*.yaml"):
        shutil.copy(path, root / "smoke" / path.name)
    locked = cli(root, "lock")
    assert locked.exit_code == 0, locked.output
    lock = yaml.safe_load((root / "images.lock").read_text())
    lock["builds"][BUILD]["image"] = {"image_id": "sha256:" + "1" * 64}
    (root / "images.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    return root


def cli(root: Path, *args: str, env: dict[str, str] | None = None) -> CliResult:
    cache = str(root / ".cache")
    return run_cli("--project", str(root), "--cache-dir", cache, "--quiet", *args, env=env)


def smoke(root: Path, server: Path, model: Path, *args: str) -> SmokeRun:
    return run_smoke_cli(root, "--command", str(server), "--model", str(model), *args)


def profile_with(root: Path, name: str, **expect: Any) -> str:
    """The CPU reference as ``name``, its args edited by ``args`` (a function of the list)
    and ``expect`` replaced, deep checks left out unless given."""
    data = yaml.safe_load((root / "smoke" / f"{PROFILE}.yaml").read_text())
    edit = expect.pop("args", None)
    if edit is not None:
        data["args"] = edit(data["args"])
    deep = ("lossless", "long_output", "acceptance_per_position", "burn_in", "long_context",
            "chat")  # fmt: skip
    data["expect"] = {k: v for k, v in data["expect"].items() if k not in deep} | expect
    (root / "smoke" / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return name


# --- smoke ----------------------------------------------------------------------------------


def test_smoke_and_deep_pass_with_draft_speculation_accepted(
    project: Path, server: Path, model: Path
) -> None:
    """The whole CPU reference: acceptance from each response's draft counts, and greedy
    speculation exactly lossless against a second boot without it."""
    run = smoke(project, server, model, "--profile", PROFILE, "--deep", "--record", BUILD)
    assert run.returncode == 0, run.explain()
    assert run.result is not None and run.result["verdict"] == "pass"
    accept = run.check("accept_len")
    assert accept["status"] == "pass" and "from per-response counts" in accept["detail"]
    assert run.result["accept_len"] >= 3.0
    lossless = run.check("lossless")
    assert lossless["status"] == "pass", run.explain()
    assert "identical token by token" in lossless["detail"]
    assert "second boot without speculation" in lossless["detail"]
    deep = ("long-output", "acceptance-per-position", "burn-in", "long-context", "chat")
    assert {name: run.check(name)["status"] for name in deep} == dict.fromkeys(deep, "pass")
    assert run.result["served_version"] == f"b{LLAMA_CPP_BUILD}"
    recorded = yaml.safe_load((project / "images.lock").read_text())["builds"][BUILD]["smoke"]
    entry = next(iter(recorded.values()))[PROFILE]
    assert entry["verdict"] == "pass" and entry["engine"] == "llamacpp"
    assert entry["checks"]["lossless"] == "pass" and entry["verified"] is False


def test_nan_weights_fail_the_nan_check(project: Path, server: Path) -> None:
    name = profile_with(project, "nan", speculation=True, min_accept_len=3.0)
    run = smoke(project, server, tiny_gguf(nan=True), "--profile", name)
    assert run.returncode == 1
    nan = run.check("nan")
    assert nan["status"] == "fail" and "logprobs are NaN, null or infinite" in nan["detail"]


def test_a_draft_model_that_never_drafts_is_caught_and_named(
    project: Path, server: Path, model: Path
) -> None:
    """-md without --spec-type: b11434 loads the draft and drafts nothing. The accept_len
    check fails, and the signature names the flag that fixes it."""

    def without_spec_type(args: list[str]) -> list[str]:
        at = args.index("--spec-type")
        return args[:at] + args[at + 2 :]

    name = profile_with(project, "silent", args=without_spec_type)
    run = smoke(project, server, model, "--profile", name)
    assert run.returncode == 1, run.explain()
    assert run.check("accept_len")["status"] == "fail"
    assert "speculation inactive" in run.check("accept_len")["detail"]
    assert run.result is not None
    diagnoses = [d["id"] for d in run.result["diagnoses"]]
    assert "llamacpp-draft-model-without-spec-type" in diagnoses, run.explain()


def test_a_removed_flag_stops_the_boot_with_its_remedy(
    project: Path, server: Path, model: Path
) -> None:
    name = profile_with(project, "oldflags", args=lambda a: [*a, "--draft-max", "4"])
    run = smoke(project, server, model, "--profile", name)
    assert run.returncode == 1
    assert run.check("boot")["status"] == "fail"
    assert run.result is not None
    assert [d["id"] for d in run.result["diagnoses"]] == ["llamacpp-removed-draft-flags"]


# --- bench, the lock and the report -----------------------------------------------------------


def test_bench_reports_acceptance_from_the_draft_counts(
    project: Path, server: Path, model: Path
) -> None:
    runs = project / "runs"
    runs.mkdir()
    out = runs / "bench.json"
    result = run_cli(
        "--project", str(project), "bench", "--command", str(server), "--profile", PROFILE,
        "--model", str(model), "--pp", "64", "--tg", "32", "-c", "1,2", "--runs", "2",
        "--no-warmup", "--json-file", str(out), "--record", BUILD, process=True, timeout=600,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["engine"]["name"] == "llamacpp" and report["complete"]
    assert report["engine"]["version"] == f"b{LLAMA_CPP_BUILD}"
    assert report["prompts"]["calibration"] == "tokenize"  # llama.cpp's own /tokenize body
    for cell in report["cells"]:
        assert cell["speculation"]["source"] == "per-response counts", cell
        assert cell["accept_len"] > 2.0 and cell["errors"] == 0
        assert cell["engine_generation_tokens"] == cell["requests"] * 32
    bench = yaml.safe_load((project / "images.lock").read_text())["builds"][BUILD]["bench"]
    assert bench, "the run is recorded under the build"

    site = project / "site"
    shown = cli(project, "report", "--out", str(site), "--bench-runs", str(runs))
    assert shown.exit_code == 0, shown.output
    page = (site / "builds" / f"{BUILD}.html").read_text()
    assert PROFILE in page and "llamacpp" in page


# --- preflight of a built program ------------------------------------------------------------


def preflight(project: Path, server: Path, model: Path, *args: str) -> CliResult:
    env = {"SPARKBUILD_CPU_GGUF": str(model)}
    return cli(project, "preflight", BUILD, "--server", str(server), "--json", *args, env=env)


def test_preflight_asks_the_program_itself(project: Path, server: Path, model: Path) -> None:
    done = preflight(project, server, model, "--profile", PROFILE)
    assert done.exit_code == 0, done.output
    (report,) = json.loads(done.stdout)["results"]
    assert report["verdict"] == "pass" and report["where"] == "server"
    version = report["checks"]["version"]
    assert version["status"] == "pass" and "cannot show" in version["detail"]
    checks = report["profiles"][PROFILE]["checks"]
    assert checks["flags"]["status"] == "pass"
    assert (
        checks["model"]["status"] == "pass" and "loaded it on the CPU" in checks["model"]["detail"]
    )


def test_preflight_fails_a_line_the_parser_refuses_and_a_file_that_is_no_model(
    project: Path, server: Path, model: Path, tmp_path: Path
) -> None:
    name = profile_with(project, "pf-old", args=lambda a: [*a, "--draft-max", "4"])
    done = preflight(project, server, model, "--profile", name)
    assert done.exit_code == 1
    (report,) = json.loads(done.stdout)["results"]
    flags = report["profiles"][name]["checks"]["flags"]
    assert flags["status"] == "fail" and "the argument has been removed" in flags["detail"]
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"PK\x03\x04 this is a zip")
    done = preflight(project, server, bogus, "--profile", PROFILE)
    (report,) = json.loads(done.stdout)["results"]
    assert "not a GGUF file" in report["profiles"][PROFILE]["checks"]["model"]["detail"]


def test_preflight_of_a_built_program_says_where_it_runs(project: Path, model: Path) -> None:
    python = cli(project, "preflight", BUILD, "--python", "/usr/bin/python3")
    assert python.exit_code == 2 and "--server PATH" in python.stderr
    nowhere = cli(project, "preflight", BUILD, env={"SPARKBUILD_CPU_GGUF": str(model)})
    assert nowhere.exit_code != 0 and "--in-image, --image IMAGE or --server PATH" in (
        nowhere.stderr
    )
    assert "Traceback" not in python.output + nowhere.output


# --- an engine someone else started -----------------------------------------------------------


@pytest.fixture(scope="module")
def running(server: Path, model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    adapter = adapter_for("llamacpp")
    argv = [str(server), *adapter.serve_args(str(model), "127.0.0.1", port, ["--threads", "1"])]
    log = tmp_path_factory.mktemp("url") / "server.log"
    target = ProcessTarget(argv, port=port, log_path=log)
    with target:
        assert wait_ready(target, adapter, 120).ready
        yield target.base_url


def test_a_url_run_finds_the_engine_it_talks_to(running: str, tmp_path: Path) -> None:
    """bench at a URL, without a profile: the server names itself (owned_by: llamacpp), and
    prompts are counted by its own /tokenize."""
    out = tmp_path / "url.json"
    result = run_cli(
        "--project", str(tmp_path), "bench", "--url", running, "--pp", "32", "--tg", "8",
        "-c", "1", "--runs", "1", "--no-warmup", "--json-file", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["engine"]["name"] == "llamacpp"
    assert report["engine"]["max_model_len"] == 1024  # the slot's context, from /v1/models
    (cell,) = report["cells"]
    assert cell["speculation"] is None  # no draft model: no acceptance to report
