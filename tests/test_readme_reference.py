"""README's figures from "this project's build machine" are the shipped reference's
(`benchmarks/cpu-reference.json`), which the quick start compares against: one source, held
equal here; and the reference was made with the CPU reference profile as it is now (an older
profile's environment made compare print a difference nobody changed)."""

from __future__ import annotations

from pathlib import Path

import yaml

from sparkbuild.bench.report import load_report, markdown
from tests.support.cli import RunCli

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "benchmarks" / "cpu-reference.json"
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_reference_was_made_with_the_current_profile() -> None:
    report = load_report(REFERENCE)
    profile = yaml.safe_load((ROOT / "smoke" / "cpu-reference.yaml").read_text())
    assert report.profile == "cpu-reference"
    assert report.engine.args == [str(arg) for arg in profile["args"]]
    assert report.engine.env == {k: str(v) for k, v in profile["env"].items()}
    host = report.host  # what compare shows beside a user's run
    assert host.cpu_model and host.cpus and host.memory_gib
    assert host.load_start and host.load_end


def test_readme_shows_the_references_own_rows() -> None:
    rows = [line for line in markdown(load_report(REFERENCE)).splitlines() if line.startswith("|")]
    assert len(rows) >= 4  # header, rule, a row per cell
    missing = [row for row in rows if row not in README]
    assert not missing, f"README.md lacks the reference's rows: {missing}"


def test_readme_shows_the_references_claims_table(run_cli: RunCli, tmp_path: Path) -> None:
    post = tmp_path / "post.md"
    result = run_cli(
        "--project", str(ROOT), "bench", "compare", str(REFERENCE),
        "--claims", "qwen3.6-27b-sglang-vllm", "--claims-setup", "S2", "--markdown", str(post),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    written = post.read_text(encoding="utf-8").strip()
    assert written in README, "README.md's claims table is not the reference's: regenerate it"
