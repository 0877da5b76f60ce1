"""`bench --resume FILE` without an engine: what a resumed sweep must share with the run it
continues, the refusals before any boot, and the report written after every cell (the real
interrupted and resumed sweep is tests/test_bench_sweep.py's, on the CPU engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkbuild.bench.checkpoint import write_checkpoint
from sparkbuild.bench.host import host_info
from sparkbuild.bench.resume import Launch, Resume, differences, load_resume
from sparkbuild.bench.runner import BenchPlan
from sparkbuild.errors import UsageError
from tests.support.cli import RunCli
from tests.test_bench_arena import _report

ROOT = Path(__file__).resolve().parents[1]


def _unfinished(tmp_path: Path) -> Path:
    """The synthetic run of test_bench_arena, stopped after its first two cells."""
    report = _report()
    pending = [c.key.label() for c in report.cells[2:]]
    stopped = report.model_copy(update={"cells": report.cells[:2], "complete": False,
                                        "pending_cells": pending, "profile": "cpu",
                                        "host": host_info()})  # fmt: skip
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


COMMAND = Launch("vllm", "command", "python -m vllm.entrypoints.openai.api_server")


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
    assert differences(resume, changed, Launch("sglang", "image", "img")) == [
        "engine: vllm then, sglang now",
        "profile: cpu then, cpu-2 now",
        "model: tiny/llama then, other/model now",
        # named by flag (issue 42): "without 1024; with 2048" said which values, not where
        "serve flags: --max-model-len 1024 → 2048; method ngram → (unset); "
        "num_speculative_tokens 3 → (unset)",
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
    assert "engine differs from that sweep's (serve flags: --max-model-len 1024 → 2048;" in (
        result.stderr
    )
    assert "hint: launch it as that run did, from that host, or start a new sweep" in result.stderr
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


# --- a resumed file is input like any other (issue 46) -----------------------------------


def _edited(tmp_path: Path, edit: Any) -> Path:
    """The unfinished run, its JSON edited as a careless or hostile hand would."""
    path = _unfinished(tmp_path)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _set_sweep(**values: Any) -> Any:
    return lambda data: data["sweep"].update(values)


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        # A file edited to concurrency 1100 sent 1,103 requests at once (issue 46, high).
        (_set_sweep(concurrency=[1, 1100]), "concurrency 1100 is outside 1-1024, what "
                                            "--concurrency takes"),
        (_set_sweep(pp=[0]), "pp 0 is outside 1-4194304, what --pp takes"),
        (_set_sweep(depth=[-5, 0]), "depth -5 is outside 0-4194304, what --depth takes"),
        (_set_sweep(runs=5000), "runs 5000 is outside 1-100, what --runs takes"),
        (_set_sweep(concurrency=[1, 2, 2]), "concurrency lists 2 more than once"),
        (_set_sweep(pp=list(range(1, 20_002))), "its grid has 80004 cells, more than 10000"),
    ],
    ids=["concurrency", "pp", "depth", "runs", "twice", "cells"],
)  # fmt: skip
def test_a_resumed_grid_is_held_to_the_command_lines_bounds(
    run_cli: RunCli, tmp_path: Path, edit: Any, said: str
) -> None:
    path = _edited(tmp_path, edit)
    result = run_cli("bench", "--url", "http://127.0.0.1:9", "--resume", str(path))
    assert result.exit_code == 2, result.output
    assert f"--resume {path}: its sweep is outside what the command line takes: " in result.stderr
    assert said in result.stderr


def _add_cell(change: dict[str, Any]) -> Any:
    def edit(data: dict[str, Any]) -> None:
        data["cells"].append({**data["cells"][0], **change})

    return edit


def _drop_a_run(data: dict[str, Any]) -> None:
    data["cells"][1]["runs"] = data["cells"][1]["runs"][:1]


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (_add_cell({"pp": 999}), "pp=999 tg=16 depth=0 c=1 is not a cell of its sweep"),
        (_add_cell({}), "pp=32 tg=16 depth=0 c=1 is listed twice"),
        (_drop_a_run, "pp=32 tg=16 depth=0 c=2 has 1 runs, its sweep 2"),
    ],
    ids=["outside", "twice", "runs"],
)
def test_a_resumed_file_carries_only_whole_cells_of_its_grid(
    tmp_path: Path, edit: Any, said: str
) -> None:
    with pytest.raises(UsageError, match="a sweep carries only cells of its own grid") as caught:
        load_resume(_edited(tmp_path, edit))
    assert said in caught.value.message


def test_another_url_or_host_is_another_engine(tmp_path: Path) -> None:
    def at_url(data: dict[str, Any]) -> None:
        data["target"] = {"kind": "url", "value": "http://engine-a:8000"}

    resume = load_resume(_edited(tmp_path, at_url))
    assert differences(resume, _plan(), Launch("vllm", "url", "http://engine-a:8000")) == []
    assert differences(resume, _plan(), Launch("vllm", "url", "http://engine-b:8000")) == [
        "url: http://engine-a:8000 then, http://engine-b:8000 now"
    ]

    def elsewhere(data: dict[str, Any]) -> None:
        data["host"].update(hostname="other-box", cpus=64)

    (tmp_path / "host").mkdir()
    resume = load_resume(_edited(tmp_path / "host", elsewhere))
    here = host_info()
    assert differences(resume, _plan(), COMMAND) == [
        f"host: hostname other-box then, {here.hostname} now, cpus 64 then, {here.cpus} now"
    ]


def test_the_engine_that_answers_must_be_the_one_measured(tmp_path: Path) -> None:
    from sparkbuild.bench.resume import check_same_answer

    resume = load_resume(_unfinished(tmp_path))
    same = resume.earlier.engine
    check_same_answer(resume, same)  # the same release and model: goes on
    with pytest.raises(UsageError, match="served model: tiny/llama then, other/model now"):
        check_same_answer(resume, same.model_copy(update={"served_model": "other/model"}))
    with pytest.raises(UsageError, match=r"version: 0\.32\.0 then, not reported now"):
        check_same_answer(resume, same.model_copy(update={"version": None}))


def test_a_report_from_before_process_spans_stands_for_one_process(tmp_path: Path) -> None:
    from sparkbuild.bench.checkpoint import sweep_time

    resume = load_resume(_unfinished(tmp_path))
    (span,) = resume.spans()
    assert (span.started, span.ended) == ("2026-11-22T00:58:40+0000", "2026-11-22T01:00:00+0000")
    assert span.seconds == 80.0 and span.boot_seconds == 30.0 and len(span.cells) == 2
    later = span.model_copy(update={"seconds": 20.5, "boot_seconds": 10.0})
    assert sweep_time([span, later]) == (100.5, 40.0)


def test_a_record_of_a_resumed_sweep_marks_the_cells_it_carried() -> None:
    from sparkbuild.bench.record import bench_record
    from sparkbuild.bench.results import Resumed

    report = _report()
    carried = [c.key.label() for c in report.cells[:2]]
    resumed = report.model_copy(update={"resumed_from": Resumed(file="run.json", cells=carried)})
    assert [c.carried for c in bench_record(resumed).cells] == [True, True, None, None]
    assert [c.carried for c in bench_record(report).cells] == [None] * 4


def test_a_sweep_file_is_held_to_the_same_bounds(tmp_path: Path) -> None:
    """``--sweep FILE`` is a grid from a file too: the bounds are the command line's."""
    from sparkbuild.bench.arena import named_sweep

    official = ROOT / "src" / "sparkbuild" / "data" / "bench" / "spark-arena-v2.yaml"
    data = yaml.safe_load(official.read_text())
    data["args"]["concurrency"] = [1, 2, 5, 1100]
    data["schedule"] = [[d, 1100 if c == 10 else c] for d, c in data["schedule"]]
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(UsageError, match="concurrency 1100 is outside 1-1024, what --concurrency"):
        named_sweep(str(edited))
