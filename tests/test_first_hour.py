"""The smaller things a new user met in the first hour: each message says the one thing that
matters and names things that exist."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sparkbuild.cli import main
from tests.support.cli import RunCli
from tests.test_bench_figures import _report

ROOT = Path(__file__).resolve().parents[1]


def _with_args(report: Path, args: list[str], name: str) -> Path:
    data = json.loads(report.read_text())
    data["engine"]["args"] = args
    path = report.with_name(name)
    path.write_text(json.dumps(data))
    return path


def test_compare_names_the_one_setting_that_differs(run_cli: RunCli, tmp_path: Path) -> None:
    spec = '{{"method":"ngram","num_speculative_tokens":{}}}'
    common = ["--dtype", "bfloat16", "--max-model-len", "1024", "--speculative-config"]
    a = _with_args(_report(tmp_path), [*common, spec.format(3)], "a.json")
    b = _with_args(_report(tmp_path), [*common, spec.format(1)], "b.json")
    result = run_cli("bench", "compare", str(a), str(b))
    assert result.exit_code == 0, result.output
    assert "comparing engine arguments: num_speculative_tokens 3 → 1" in result.stderr
    assert "--max-model-len" not in result.stderr  # not both full argument strings


def test_claims_without_a_matching_setup_print_no_empty_table(
    run_cli: RunCli, tmp_path: Path
) -> None:
    claims = ROOT / "claims" / "qwen3.6-27b-sglang-vllm.yaml"
    result = run_cli("bench", "compare", str(_report(tmp_path)), "--claims", str(claims))
    assert result.exit_code == 0, result.output
    assert "no claim is about this run" in result.stdout
    assert "┏" not in result.stdout and "└" not in result.stdout


def test_a_missing_matplotlib_is_a_usage_error(
    run_cli: RunCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    report = str(_report(tmp_path))
    result = run_cli("bench", "compare", report, report, "--plot", str(tmp_path / "p.png"))
    assert result.exit_code == 2, result.output
    assert "--plot needs matplotlib" in result.stderr
    assert "pip install 'sparkbuild[plot]'" in result.stderr


def test_bench_boot_timeout_has_help(run_cli: RunCli) -> None:
    result = run_cli("bench", "--help")
    line = next(line for line in result.stdout.splitlines() if "--boot-timeout" in line)
    assert "ready" in line or "ready" in result.stdout.split("--boot-timeout", 1)[1][:200]


@pytest.mark.parametrize("command", ["smoke", "bench"])
def test_the_usage_hint_names_a_profile_that_exists(run_cli: RunCli, command: str) -> None:
    result = run_cli("--project", str(ROOT), command, "--profile", "cpu-reference")
    assert result.exit_code == 2
    hint = next(line for line in result.stderr.splitlines() if line.startswith("hint:"))
    named = hint.split("--profile ", 1)[1].split()[0]
    assert (ROOT / "smoke" / f"{named}.yaml").is_file(), hint


def test_the_group_help_says_global_options_may_follow_the_command() -> None:
    assert "may also follow the command" in (main.help or "")
