"""`bench --claims` and `bench compare --claims` against real vLLM on the CPU.

One engine boot (n-gram speculation on a tiny random-weight Llama), one small sweep, and a
claims file holding a matching claim far from any CPU figure, a claim at a concurrency the
sweep does not run, and (in a second copy) a malformed claim, which must stop the command
before any engine starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import run_cli
from tests.support.vllm_cpu import ENGINE_ARGS, ENGINE_ENV, NGRAM, tiny_llama, vllm_server_command

pytestmark = pytest.mark.engine

SWEEP = ["--pp", "32", "--tg", "16", "--depth", "0", "--concurrency", "1,2", "--runs", "2"]
CLAIMED_DECODE = 1000.0
# With 3 speculative tokens a step yields at most 4 tokens: 10 is a claim no run can meet.
CLAIMED_ACCEPT = 10.0

CLAIMS = f"""\
source: "sparkbuild's CPU reference test"
date: "2026-11"
setups:
  spark:
    engine: vllm
    version: "0.33.0"
    image: vllm/vllm-openai:v0.33.0-aarch64
    model: tiny-llama-v2  # matches the cached model's directory name
    flags: [--dtype, bfloat16, --max-model-len, 8192]
    profile: cpu-spec
    harness: llama-benchy 0.4.0
    hardware: 1x DGX Spark (GB10)
claims:
  - setup: spark
    cell: {{pp: 32, tg: 16, depth: 0, concurrency: 1}}
    decode_tps: {CLAIMED_DECODE}
    accept_len: {CLAIMED_ACCEPT}
  - {{setup: spark, cell: {{pp: 32, tg: 16, depth: 0, concurrency: 8}}, decode_tps: 500}}
"""
MALFORMED = "  - {setup: spark, cell: {pp: 32, tg: 16, depth: 0, concurency: 2}, decode_tps: 5}\n"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("claims-project")
    profile = {
        "engine": "vllm",
        "model": str(tiny_llama()),
        "args": [*ENGINE_ARGS, "--speculative-config", NGRAM],
        "env": ENGINE_ENV,
        "expect": {"boot_timeout_s": 600},
        "container": {"gpus": "none"},
    }  # fmt: skip
    (root / "smoke").mkdir()
    (root / "smoke" / "cpu-spec.yaml").write_text(yaml.safe_dump(profile), encoding="utf-8")
    (root / "claims").mkdir()
    (root / "claims" / "spark.yaml").write_text(CLAIMS, encoding="utf-8")
    (root / "claims" / "broken.yaml").write_text(CLAIMS + MALFORMED, encoding="utf-8")
    return root


def _bench(project: Path, *args: str) -> Any:
    return run_cli("--project", str(project), "--quiet", "bench", *args)


@pytest.fixture(scope="module")
def run(project: Path) -> dict[str, Any]:
    """`bench --command ... --claims` on the real engine: report, claims JSON and Markdown."""
    result = _bench(
        project, "--command", vllm_server_command(), "--profile", "cpu-spec", *SWEEP,
        "--claims", "spark", "--json-file", str(project / "run.json"),
        "--claims-json", str(project / "claims.json"), "--markdown", str(project / "run.md"),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return {
        "stdout": result.stdout,
        "report": json.loads((project / "run.json").read_text()),
        "claims": json.loads((project / "claims.json").read_text()),
        "markdown": (project / "run.md").read_text(),
    }


def test_malformed_claim_stops_before_the_engine_boots(project: Path) -> None:
    result = _bench(project, "--command", vllm_server_command(), "--profile", "cpu-spec",
                    *SWEEP, "--claims", "broken")  # fmt: skip
    assert result.exit_code == 2, result.output
    path = project / "claims" / "broken.yaml"
    line = len(CLAIMS.splitlines()) + 1
    assert f"{path}:{line}: unknown field 'claims[2].cell.concurency'" in result.output
    assert "did you mean 'concurrency'?" in result.output
    assert not (project / ".sparkbuild" / "bench-logs").exists()  # no engine was started


def _rows(claims: dict[str, Any], concurrency: int) -> dict[str, dict[str, Any]]:
    return {r["metric"]: r for r in claims["rows"] if r["cell"]["concurrency"] == concurrency}


def test_far_claim_is_reported_with_its_ratio(run: dict[str, Any]) -> None:
    rows = _rows(run["claims"], 1)
    cell = next(c for c in run["report"]["cells"] if c["concurrency"] == 1)
    accept = rows["accept_len"]
    assert accept["status"] == "compared"
    assert accept["measured"]["median"] == cell["accept_len"] > 1.0
    assert accept["ratio"] == pytest.approx(cell["accept_len"] / CLAIMED_ACCEPT, rel=1e-3)
    assert 0.1 < accept["ratio"] <= 0.4
    assert f"{accept['ratio']:.2f}\N{MULTIPLICATION SIGN}" in run["markdown"]
    decode = rows["decode_tps"]
    # A burst run has no client rate (a busy host); the claim is held against the others.
    measured = [
        r["decode_tps_aggregate"]
        for r in cell["runs"]
        if not r["burst"] and r["decode_tps_aggregate"] is not None
    ]
    if not measured:
        assert decode["status"] == "not comparable" and "burst" in decode["reason"]
    else:
        assert decode["status"] == "compared"
        assert decode["measured"]["min"] == pytest.approx(min(measured), rel=1e-3)
        assert decode["measured"]["max"] == pytest.approx(max(measured), rel=1e-3)
        ratio = decode["measured"]["median"] / CLAIMED_DECODE
        assert decode["ratio"] == pytest.approx(ratio, rel=1e-3)
    settings = {d["setting"] for d in run["claims"]["differences"]["spark"]}
    # the claim publishes no topology, the run is one box: said, not assumed
    assert settings == {
        "engine version",
        "image",
        "flags",
        "harness",
        "prompt set",
        "hardware",
        "topology",
    }


def test_other_concurrency_is_not_comparable(run: dict[str, Any]) -> None:
    row = _rows(run["claims"], 8)["decode_tps"]
    assert row["status"] == "not comparable" and row["ratio"] is None
    assert row["reason"] == "concurrency differs: claim c=8, run c=1,2"
    assert "| not comparable | concurrency differs: claim c=8, run c=1,2, " in run["markdown"]


def test_compare_gives_the_same_verdicts_from_the_saved_report(
    project: Path, run: dict[str, Any]
) -> None:
    result = _bench(project, "compare", str(project / "run.json"), "--claims", "spark",
                    "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rows"] == run["claims"]["rows"]
