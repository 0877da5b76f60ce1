"""Claims files: validation with file and line, the shipped files, and how a report is matched.

The reports here are written as `bench --json` writes them (the schema's own models), with
figures chosen so each outcome can be told apart; tests/test_bench_claims_engine.py holds a
real CPU engine run against claims.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkbuild.bench.claims import load_claim_files, load_claims
from sparkbuild.bench.claims_report import compare_claims, flag_difference, parse_flags
from sparkbuild.bench.results import BenchReport
from sparkbuild.errors import SpecError, UsageError
from sparkbuild.settings import Settings
from tests.support.cli import run_cli

ROOT = Path(__file__).resolve().parent.parent

CLAIMS = """\
source: "a test post"
date: 2026-03
setups:
  s1:
    engine: vllm
    version: "0.33.0"
    image: vllm/vllm-openai:v0.33.0-aarch64
    model: org/tiny-llama
    flags: [--max-model-len, 8192, --gpu-memory-utilization, 0.80]
    profile: tiny-spec
    harness: llama-benchy 0.4.0
    hardware: 1x DGX Spark (GB10)
  other:
    engine: sglang
    model: org/another-model
    harness: llama-benchy
claims:
  - {setup: s1, cell: {pp: 32, tg: 16, depth: 0, concurrency: 1}, decode_tps: 400, ttft_ms: 10}
  - {setup: s1, cell: {pp: 32, tg: 16, depth: 0, concurrency: 4}, decode_tps: 300}
  - {setup: s1, cell: {pp: 4096, tg: 16, depth: 0, concurrency: 1}, decode_tps: 20}
  - {setup: s1, cell: {tg: 16}, accept_len: [1.5, 2.5]}
  - {setup: other, cell: {concurrency: 1}, decode_tps: 9}
"""


def _run(concurrency: int, decode: list[float], accept: float | None) -> dict[str, Any]:
    runs = [
        {"ttft_s": 0.02, "prefill_tps": 1600.0, "decode_tps_request": d / concurrency,
         "decode_tps_aggregate": d, "output_tps": d * 0.9, "seconds": 0.2,
         "requests": concurrency, "errors": 0, "prompt_tokens": 32 * concurrency,
         "completion_tokens": 16 * concurrency, "accept_len": accept}
        for d in decode
    ]  # fmt: skip
    stat = {"median": None, "min": None, "max": None, "n": 0}
    return {
        "pp": 32, "tg": 16, "depth": 0, "concurrency": concurrency,
        "ttft_s": stat, "prefill_tps": stat, "decode_tps_request": stat,
        "decode_tps_aggregate": stat, "output_tps": stat, "accept_len": accept,
        "prompt_tokens_target": 32, "prompt_tokens": 32, "completion_tokens": 16,
        "requests": concurrency * len(decode), "errors": 0, "runs": runs,
    }  # fmt: skip


def report(**changes: Any) -> BenchReport:
    data: dict[str, Any] = {
        "created": "2026-11-22T00:00:00+0000",
        "label": "tiny-spec · command",
        "profile": "tiny-spec",
        "harness": {"version": "1", "sparkbuild": "0", "http_client": "httpx"},
        "host": {"hostname": "ci", "platform": "Linux", "machine": "x86_64", "cpus": 2,
                 "python": "3.11"},
        "target": {"kind": "command", "value": "python -m vllm.entrypoints.openai.api_server"},
        "engine": {"name": "vllm", "version": "0.32.0", "model": "/cache/models/tiny-llama",
                   "served_model": "/cache/models/tiny-llama",
                   "args": ["--max-model-len", "1024", "--gpu-memory-utilization", "0.8"]},
        "sweep": {"pp": [32], "tg": [16], "depth": [0], "concurrency": [1, 2], "runs": 3},
        "prompts": {"recipe": "builtin-prose-v1", "seed": 0, "calibration": "tokenize",
                    "fingerprint": "ab" * 32, "exact": True},
        "complete": True,
        "cells": [_run(1, [100.0, 80.0, 120.0], 2.2), _run(2, [150.0, 160.0, 170.0], 2.4)],
    }  # fmt: skip
    data.update(changes)
    return BenchReport.model_validate(data)


def _write(tmp_path: Path, text: str, name: str = "claims.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _rows(tmp_path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    result = compare_claims(report(), load_claims(_write(tmp_path, CLAIMS)))
    return {(row.claim.id, row.metric): row.to_json() for row in result.rows}


def test_far_claim_is_compared_with_its_ratio(tmp_path: Path) -> None:
    rows = _rows(tmp_path)
    decode = rows[("s1 pp=32 tg=16 depth=0 c=1", "decode_tps")]
    assert decode["status"] == "compared"
    assert decode["measured"] == {"median": 100.0, "min": 80.0, "max": 120.0, "n": 3}
    assert decode["ratio"] == 0.25  # 100 measured against 400 claimed
    ttft = rows[("s1 pp=32 tg=16 depth=0 c=1", "ttft_ms")]
    assert ttft["measured"]["median"] == pytest.approx(20.0) and ttft["ratio"] == 2.0


def test_other_concurrency_is_not_comparable_and_says_why(tmp_path: Path) -> None:
    row = _rows(tmp_path)[("s1 pp=32 tg=16 depth=0 c=4", "decode_tps")]
    assert row["status"] == "not comparable" and row["ratio"] is None
    assert row["reason"] == "concurrency differs: claim c=4, run c=1,2"


def test_missing_cell_is_not_reproduced_and_other_models_are_left_out(tmp_path: Path) -> None:
    rows = _rows(tmp_path)
    row = rows[("s1 pp=4096 tg=16 depth=0 c=1", "decode_tps")]
    assert row["status"] == "not reproduced"
    assert "no cell pp=4096 tg=16 depth=0" in row["reason"]
    assert not any(key[0].startswith("other") for key in rows)


def test_range_claim_pools_every_matching_cell(tmp_path: Path) -> None:
    row = _rows(tmp_path)[("s1 pp=? tg=16 depth=? c=?", "accept_len")]
    assert row["measured"]["median"] == pytest.approx(2.3)  # cells at 2.2 and 2.4
    assert row["ratio"] == 1.0  # inside [1.5, 2.5]
    assert row["unpublished"] == ["pp", "depth", "concurrency"]


def test_every_differing_setting_is_named(tmp_path: Path) -> None:
    result = compare_claims(report(), load_claims(_write(tmp_path, CLAIMS)))
    found = {d.setting: d for d in result.differences["s1"]}
    assert set(found) == {"engine version", "image", "flags", "harness", "prompt set", "hardware"}
    # 0.80 and 0.8 are one setting; only --max-model-len differs.
    assert (found["flags"].claim, found["flags"].run) == (
        "--max-model-len 8192",
        "--max-model-len 1024",
    )
    assert found["image"].run == "none (local command)"


def test_setup_chosen_by_name_is_held_against_any_model(tmp_path: Path) -> None:
    claims = load_claims(_write(tmp_path, CLAIMS))
    result = compare_claims(report(), claims, ["other"])
    assert [(r.claim.setup_name, r.status) for r in result.rows] == [("other", "compared")]
    assert result.differences["other"][0].setting == "engine"
    assert result.other_claims == 4


@pytest.mark.parametrize(
    ("replace", "expected"),
    [
        ("concurrency: 4}, decode_tps: 300", ":19: unknown field 'claims[1].cell.concurency'; "
         "did you mean 'concurrency'?"),
        ("decode_tps: 300}", ":19: claims[1].decode_tps"),
        ("{setup: s1, cell: {pp: 4096", ":20: claims[2].setup: no setup 's9'"),
        ("date: 2026-03", ":2: date: date must be YYYY"),
    ],
)  # fmt: skip
def test_malformed_claims_name_file_and_line(tmp_path: Path, replace: str, expected: str) -> None:
    broken = {
        "concurrency: 4}, decode_tps: 300": "concurency: 4}, decode_tps: 300",
        "decode_tps: 300}": "decode_tps: -3}",
        "{setup: s1, cell: {pp: 4096": "{setup: s9, cell: {pp: 4096",
        "date: 2026-03": "date: March 2026",
    }[replace]
    path = _write(tmp_path, CLAIMS.replace(replace, broken))
    with pytest.raises(SpecError) as caught:
        load_claims(path)
    assert f"{path}{expected}" in str(caught.value)


def test_a_claim_without_a_figure_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, CLAIMS.replace(", accept_len: [1.5, 2.5]", ""))
    with pytest.raises(SpecError, match=r"claims\.yaml:21: claims\[3\]: a claim"):
        load_claims(path)


def test_flags_parse_in_every_spelling() -> None:
    args = ["--tp", "4", "--trust-remote-code", "--mem-fraction-static=0.80", "-sc", "{}"]
    assert parse_flags(args) == {
        "--tp": "4", "--trust-remote-code": "on", "--mem-fraction-static": "0.80", "-sc": "{}",
    }  # fmt: skip
    assert flag_difference(["--x", "1.0"], ["--x=1"]) is None
    difference = flag_difference(["--tp", "4"], ["--enable-metrics"])
    assert difference is not None
    assert (difference.claim, difference.run) == ("--tp 4", "--enable-metrics")


def test_shipped_claims_load_together(tmp_path: Path) -> None:
    files = [str(p) for p in sorted((ROOT / "claims").glob("*.yaml"))]
    claims = load_claim_files(Settings(project_dir=ROOT), files)
    assert len({(c.file, c.setup_name) for c in claims}) == len({c.setup_name for c in claims})
    twice = [files[0], str(_write(tmp_path, (ROOT / "claims" / Path(files[0]).name).read_text()))]
    with pytest.raises(UsageError, match="is in both"):
        load_claim_files(Settings(project_dir=ROOT), twice)


def test_shipped_claims_validate_and_name_real_profiles() -> None:
    profiles = {p.stem for p in (ROOT / "smoke").glob("*.yaml")}
    files = sorted((ROOT / "claims").glob("*.yaml"))
    assert len(files) >= 5
    for path in files:
        claims = load_claims(path)
        assert claims, path.name
        for claim in claims:
            assert claim.setup.profile in (None, *profiles), (path.name, claim.setup_name)
            assert claim.date.startswith("2026"), path.name


def _cli(tmp_path: Path, *args: str) -> Any:
    return run_cli("--project", str(tmp_path), "--quiet", "bench", *args)


def test_compare_cli_holds_a_report_against_claims(tmp_path: Path) -> None:
    (tmp_path / "claims").mkdir()
    _write(tmp_path / "claims", CLAIMS, "post.yaml")
    run = tmp_path / "run.json"
    run.write_text(report().model_dump_json(), encoding="utf-8")
    result = _cli(tmp_path, "compare", str(run), "--claims", "post", "--json",
                  "--markdown", str(tmp_path / "post.md"))  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [r["status"] for r in data["rows"]] == [
        "compared", "compared", "not comparable", "not reproduced", "compared",
    ]  # fmt: skip
    assert data["other_claims"] == 1
    table = (tmp_path / "post.md").read_text()
    times = "\N{MULTIPLICATION SIGN}"
    row = f"| s1 pp=32 tg=16 depth=0 c=1 | decode tok/s total | 400 | 100 (80-120) | 0.25{times} |"
    assert row in table
    assert "- not reproduced (no such cell; the run swept pp=32 tg=16 depth=0 c=1,2):" in table
    assert "\n  - s1 pp=4096 tg=16 depth=0 c=1: decode tok/s total 20\n" in table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["compare", "a.json"], "two reports, or one report and --claims FILE"),
        (["compare", "a.json", "b.json", "--claims", "post"], "two reports, or one report"),
        (["compare", "a.json", "--claims", "nope"], "no claims file 'nope'"),
        (["compare", "a.json", "--claims", "post", "--claims-setup", "s7"], "--claims-setup s7"),
        (["--url", "http://127.0.0.1:9", "--claims-setup", "s1"], "--claims-setup needs --claims"),
        (
            [
                "--url",
                "http://127.0.0.1:9",
                "--json",
                "--claims",
                "post",
                "--claims-json",
                "-",
            ],
            "cannot both write to stdout",
        ),
    ],
)
def test_claims_usage_errors_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "claims").mkdir()
    _write(tmp_path / "claims", CLAIMS, "post.yaml")
    result = _cli(tmp_path, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_shipped_claims_files_parse_as_plain_yaml() -> None:
    # Every figure in the shipped files is a number or a [low, high] pair, never a string.
    for path in sorted((ROOT / "claims").glob("*.yaml")):
        for claim in yaml.safe_load(path.read_text())["claims"]:
            for key, value in claim.items():
                if key not in ("setup", "cell", "note"):
                    assert isinstance(value, int | float | list), (path.name, key, value)
