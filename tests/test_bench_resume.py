"""`bench --resume FILE` without an engine: what a resumed sweep must share with the run it
continues, the refusals before any boot, and the report written after every cell (the real
interrupted and resumed sweep is tests/test_bench_sweep.py's, on the CPU engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkbuild.bench.resume import Resume, differences, load_resume
from sparkbuild.bench.runner import BenchPlan, write_checkpoint
from sparkbuild.errors import UsageError
from tests.support.cli import RunCli
from tests.test_bench_arena import SPEC, _report

ROOT = Path(__file__).resolve().parents[1]


def _unfinished(tmp_path: Path) -> Path:
    """The synthetic run of test_bench_arena, stopped after its first two cells."""
    report = _report()
    pending = [c.key.label() for c in report.cells[2:]]
    stopped = report.model_copy(update={"cells": report.cells[:2], "complete": False,
                                        "pending_cells": pending, "profile": "cpu"})  # fmt: skip
    path = tmp_path / "run.json"
    path.write_text(stopped.model_dump_json(), encoding="utf-8")
    return path


def _plan(**changes: Any) -> BenchPlan:
    engine = _report().engine
    values: dict[str, Any] = {
        "sweep": _report().sweep, "label": "x", "profile": "cpu", "model": engine.model,
        "args": engine.args, "env": engine.env,
    }  # fmt: skip
    return BenchPlan(**{**values, **changes})


COMMAND = {"kind": "command", "value": "python -m vllm.entrypoints.openai.api_server"}


def test_the_same_engine_has_no_difference_and_each_other_setting_is_named(
    tmp_path: Path,
) -> None:
    resume = load_resume(_unfinished(tmp_path))
    assert [c.key.label() for c in resume.done] == ["pp=32 tg=16 depth=0 c=1",
                                                    "pp=32 tg=16 depth=0 c=2"]  # fmt: skip
    assert differences(resume, _plan(), COMMAND) == []
    changed = _plan(
        model="other/model", args=["--dtype", "bfloat16", "--max-model-len", "2048"],
        env={"VLLM_CPU_KVCACHE_SPACE": "2", "HF_TOKEN": "hf_secret"}, profile="cpu-2",
    )  # fmt: skip
    assert differences(resume, changed, {"kind": "image", "value": "img"}) == [
        "profile: cpu then, cpu-2 now",
        "model: tiny/llama then, other/model now",
        f"serve flags: without 1024 --speculative-config {SPEC}; with 2048",
        "environment: VLLM_CPU_KVCACHE_SPACE",
        "target: command then, image now",
    ]


def test_a_complete_or_foreign_report_is_no_resume(tmp_path: Path) -> None:
    whole = tmp_path / "whole.json"
    whole.write_text(_report().model_dump_json(), encoding="utf-8")
    with pytest.raises(UsageError, match=r"its sweep is complete \(4 cells\); nothing to resume"):
        load_resume(whole)
    from tests.support.llama_benchy import write_outputs

    benchy = write_outputs(tmp_path / "benchy")["json"]
    with pytest.raises(UsageError, match="a llama-benchy report"):
        load_resume(benchy)


def _profile(project: Path, args: list[str]) -> None:
    (project / "smoke").mkdir(parents=True)
    profile = {"engine": "vllm", "model": "tiny/llama", "args": args,
               "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_TOKEN": "hf_secret"}}  # fmt: skip
    (project / "smoke" / "cpu.yaml").write_text(yaml.safe_dump(profile), encoding="utf-8")


def test_another_engine_is_refused_before_anything_boots(run_cli: RunCli, tmp_path: Path) -> None:
    project = tmp_path / "project"
    _profile(project, ["--dtype", "bfloat16", "--max-model-len", "2048"])
    run = _unfinished(tmp_path)
    before = run.read_text()
    result = run_cli("--project", str(project), "bench", "--command",
                     "python -m vllm.entrypoints.openai.api_server", "--profile", "cpu",
                     "--resume", str(run))  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "this run's engine differs from that sweep's (serve flags: without 1024" in (
        result.stderr
    )
    assert "hint: launch it as that run did, or start a new sweep without --resume" in (
        result.stderr
    )
    assert "waiting for" not in result.output and run.read_text() == before


@pytest.mark.parametrize("typed", [["--pp", "64"], ["--seed", "3"], ["--prefix-caching"],
                                   ["--sweep", "spark-arena-v2"]])  # fmt: skip
def test_grid_options_beside_resume_are_refused(
    run_cli: RunCli, tmp_path: Path, typed: list[str]
) -> None:
    result = run_cli("bench", "--url", "http://127.0.0.1:9", "--resume",
                     str(_unfinished(tmp_path)), *typed)  # fmt: skip
    assert result.exit_code == 2 and "would be ignored" in result.stderr, result.output


def test_the_report_so_far_replaces_the_file_whole(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    out.write_text("the previous cell's report\n")
    write_checkpoint(out, _report())
    assert json.loads(out.read_text())["cells"][0]["pp"] == 32
    assert "hf_secret" not in out.read_text()  # written as every output: redacted
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no scratch left
    with pytest.raises(UsageError, match="cannot write the sweep so far: Not a directory"):
        write_checkpoint(out / "run.json", _report())  # its folder is a file


def test_a_resume_carries_its_cells_and_names_its_file(tmp_path: Path) -> None:
    resume: Resume = load_resume(_unfinished(tmp_path))
    assert resume.settings(None).sweep == _report().sweep
    assert resume.settings(None).label == "cpu run"
    record = resume.record()
    assert record.file.endswith("run.json") and len(record.cells) == 2
