"""The shared option contracts (cli/options.py): one ``--json``, ``--json-file``, ``--record``
and ``--locked`` on every command that takes them, the launch options as one
``LaunchSettings``, and ``preflight`` run through ``run_per_build`` like build and publish.

The preflight tests run the real source stage and the real probe on a tiny vLLM-shaped
package (a local git repository) under a venv that imports it: fast, and enough for the
probe to reach verdicts (its flags and signals checks fail, as nothing of vLLM is there).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from sparkbuild import lockfile
from sparkbuild.cli import options
from sparkbuild.engines.launch import LaunchSettings, TargetChoice
from tests.support.cli import CliResult, RunCli, every_command
from tests.support.gitrepos import tagged_repo

CLI = Path(__file__).resolve().parents[1] / "src" / "sparkbuild" / "cli"


def _option(command: click.Command, flag: str) -> click.Option | None:
    return next((p for p in command.params if isinstance(p, click.Option) and flag in p.opts), None)


def test_json_is_one_flag_for_stdout_everywhere() -> None:
    takes_json = {
        path: option
        for path, command in every_command().items()
        if (option := _option(command, "--json")) is not None
    }
    assert set(takes_json) >= {"build", "patches", "prepare", "publish", "rollback", "bump"}
    assert set(takes_json) >= {"releases", "smoke", "bench", "bench compare", "preflight"}
    for path, option in takes_json.items():
        assert option.is_flag and option.name == "as_json", path
        assert option.help == "Machine-readable output on stdout.", path
    with_file = {path for path, c in every_command().items() if _option(c, "--json-file")}
    assert with_file == {"smoke", "bench", "bench compare", "preflight"}


def test_record_takes_a_build_and_locked_is_a_flag_everywhere() -> None:
    commands = every_command()
    for path in ("smoke", "bench", "preflight"):
        record = _option(commands[path], "--record")
        assert record is not None and not record.is_flag and record.metavar == "BUILD", path
    assert _option(commands["preflight"], "--record").multiple  # type: ignore[union-attr]
    for path in ("patches", "prepare", "build", "preflight"):
        locked = _option(commands[path], "--locked")
        assert locked is not None and locked.is_flag and locked.name == "locked", path


def test_json_and_json_file_together_are_refused(run_cli: RunCli, tmp_path: Path) -> None:
    result = run_cli(
        "--project", str(tmp_path), "smoke", "--url", "http://127.0.0.1:9", "--profile", "x",
        "--json", "--json-file", str(tmp_path / "out.json"),
    )  # fmt: skip
    assert result.exit_code == 2
    assert "error: --json and --json-file both given" in result.stderr


def test_launch_options_reach_the_command_as_one_frozen_launch_settings(tmp_path: Path) -> None:
    seen: list[LaunchSettings] = []

    @click.command()
    @options.image()
    @options.command()
    @options.url()
    @options.profile()
    @options.model()
    @options.gpus()
    @options.boot_timeout()
    @options.request_timeout()
    @options.log()
    @click.option("--other")
    @options.launch_settings
    def probe(launch: LaunchSettings, other: str | None) -> None:
        seen.append(launch)
        assert other == "kept"

    args = ["--image", "img", "--gpus", "none", "-p", "prof", "--model", "m"]
    args += ["--boot-timeout", "5", "--request-timeout", "7", "--log", str(tmp_path / "l")]
    result = CliRunner().invoke(probe, [*args, "--other", "kept"])
    assert result.exit_code == 0, result.output
    assert seen == [
        LaunchSettings(
            TargetChoice(image="img", gpus="none"),
            profile="prof",
            model="m",
            boot_timeout_s=5.0,
            request_timeout_s=7.0,
            log_path=tmp_path / "l",
        )
    ]
    with pytest.raises(AttributeError):
        seen[0].model = "other"  # type: ignore[misc]


def test_bench_options_before_compare_are_named_as_typed(run_cli: RunCli) -> None:
    result = run_cli("bench", "-p", "x", "--json", "compare", "a.json", "b.json")
    assert result.exit_code == 2
    assert "takes no bench options before it (got --profile, --json)" in result.stderr


def test_the_command_line_raises_named_errors_only() -> None:
    """Every error the CLI raises is a SparkbuildError subclass named for what went wrong."""
    bare = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "SparkbuildError"
            ):
                bare.append(f"{path.name}:{node.lineno}")
    assert not bare, bare


# -- preflight through run_per_build ----------------------------------------------------


@pytest.fixture(scope="module")
def fake_engine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A vLLM-shaped package tagged v0.9.0, and a venv (with pip) that imports it."""
    root = tmp_path_factory.mktemp("engine")
    (root / "up" / "vllm").mkdir(parents=True)
    (root / "up" / "vllm" / "__init__.py").write_text("VERSION = '0.9.0'\n")
    tagged_repo(root / "up", "v0.9.0", "vllm 0.9.0")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "engine.pth").write_text(f"{root / 'up'}\n")
    return root / "up", venv / "bin" / "python"


@dataclass(frozen=True)
class PreflightProject:
    """Build ``a`` (the tagged release) and ``b`` (a ref that does not exist: it errors)."""

    path: Path
    cache: Path
    upstream: Path
    python: Path
    run_cli: RunCli

    def run(self, *args: str) -> CliResult:
        """``sparkbuild preflight --python VENV ARGS`` against the fake engine."""
        return self.run_cli(
            "--project", str(self.path), "--cache-dir", str(self.cache),
            "--repo", f"vllm={self.upstream}", "preflight", "--python", str(self.python), *args,
        )  # fmt: skip


@pytest.fixture
def preflight(fake_engine: tuple[Path, Path], tmp_path: Path, run_cli: RunCli) -> PreflightProject:
    upstream, python = fake_engine
    project = tmp_path / "project"
    (project / "builds").mkdir(parents=True)
    (project / "smoke").mkdir()
    spec = {
        "engine": "vllm",
        "repo": "https://github.com/vllm-project/vllm.git",
        "package_dir": "vllm",
        "builds": {"a": {"ref": "v0.9.0", "smoke": ["p"]}, "b": {"ref": "v0.9.1", "smoke": ["p"]}},
    }
    (project / "builds" / "vllm.yaml").write_text(yaml.safe_dump(spec))
    (project / "smoke" / "p.yaml").write_text(
        "engine: vllm\nmodel: /nonexistent/model\nargs: [--dtype, bfloat16]\n"
    )
    return PreflightProject(project, tmp_path / "cache", upstream, python, run_cli)


def test_preflight_reports_verdicts_and_errors_of_several_builds(
    preflight: PreflightProject, tmp_path: Path
) -> None:
    out = tmp_path / "report.json"
    result = preflight.run("a", "b", "--json-file", str(out), "--record", "a")
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith("a (vllm 0.9.0, python): fail\n  compile ")
    assert "error: b: ref 'v0.9.1' not found" in result.stderr  # and the run went on
    assert "b: b:" not in result.stderr  # the build is named once
    assert "\na: p env: VLLM_COMPUTE_NANS_IN_LOGITS is never read" in result.stderr
    last = result.stderr.strip().splitlines()[-2:]
    assert last[0] == "error: preflight did not pass: a (fail), b (error)", result.stderr
    assert last[1].startswith("hint: fix what each failure names")
    report = json.loads(out.read_text())
    assert [r["build"] for r in report["results"]] == ["a"]
    assert [f["build"] for f in report["failed"]] == ["b"]
    builds = lockfile.load(preflight.path / "images.lock").to_json()["builds"]
    assert set(builds) == {"a"}  # a failing verdict is recorded too; b never ran
    (entry,) = builds["a"]["preflight"].values()
    assert entry["profiles"]["p"]["verdict"] == "fail"


def test_preflight_record_alone_checks_just_that_build(preflight: PreflightProject) -> None:
    result = preflight.run("--record", "a", "--json")
    assert result.exit_code == 1, result.output
    payload = json.loads(result.stdout)  # only JSON on stdout: no table
    assert [r["build"] for r in payload["results"]] == ["a"] and payload["failed"] == []
    assert "b (error)" not in result.stderr
    assert "a" in lockfile.load(preflight.path / "images.lock").to_json()["builds"]


def test_preflight_record_of_a_build_it_does_not_check_is_refused(
    preflight: PreflightProject,
) -> None:
    result = preflight.run("a", "--record", "b")
    assert result.exit_code == 2
    assert "error: --record b: not among the builds this run checks (a)" in result.stderr
    assert not (preflight.path / "images.lock").exists()
