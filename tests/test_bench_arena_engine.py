"""A CPU-reference bench run (real vLLM on the CPU, tiny random-weight Llama, n-gram
speculation) exported as a Spark Arena submission, with prefix caching as Spark Arena's
official sweep runs it. One engine boot for the module: `bench --command` starts and stops it.

The submission's llama-benchy JSON is validated against llama-benchy 0.4.0's schema (its
``BenchmarkReport`` model, from PyPI), and its CSV is what llama-benchy's own writer makes of
that JSON. (The official sweep itself needs a 102176-token context, more than the CPU model
holds: tests/test_bench_arena.py checks that it is refused before boot.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkbuild.engines.recipes import import_recipe
from tests.support.cli import run_cli
from tests.support.llama_benchy import check_schema, csv_of, report_schema
from tests.support.vllm_cpu import ENGINE_ARGS, ENGINE_ENV, NGRAM, tiny_llama, vllm_server_command

pytestmark = pytest.mark.engine

ARGS = [*ENGINE_ARGS, "--speculative-config", NGRAM]
DEPTH, RUNS = 128, 2
SWEEP = ["--pp", "32", "--tg", "16", "--depth", f"0,{DEPTH}", "--concurrency", "1,2",
         "--runs", str(RUNS), "--prefix-caching"]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    project = tmp_path_factory.mktemp("arena-project")
    profile = {
        "engine": "vllm",
        "model": str(tiny_llama()),
        "description": "tiny Llama on the CPU, n-gram speculation",
        "args": ARGS,
        "env": ENGINE_ENV,
        "expect": {"boot_timeout_s": 600},
        "container": {"gpus": "none"},
    }
    (project / "smoke").mkdir()
    (project / "smoke" / "cpu-arena.yaml").write_text(yaml.safe_dump(profile))
    result = run_cli(
        "--project", str(project), "--quiet", "bench", "--command", vllm_server_command(),
        "--profile", "cpu-arena", *SWEEP, "--json-file", str(project / "run.json"),
        "--arena", str(project / "submission"),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return {
        "dir": project / "submission",
        "report": json.loads((project / "run.json").read_text()),
        "output": result.output,
    }


def test_the_run_is_written_in_spark_arenas_layout(run: dict[str, Any]) -> None:
    root: Path = run["dir"]
    for relative in ("recipes/recipe.yaml", "logs/benchmark.csv", "metadata/metadata.json"):
        assert (root / relative).is_file(), relative
    meta = json.loads((root / "metadata" / "metadata.json").read_text())
    assert meta["runtime_info"]["vllm"] == "0.32.0"  # the engine's own /version
    assert meta["benchmark"]["args"] == {
        "depth": [0, DEPTH], "pp": [32], "tg": [16], "concurrency": [1, 2],
        "prefix_caching": True, "runs": RUNS,
    }  # fmt: skip
    assert meta["timing"]["duration"] > 0
    recipe = root / "recipes" / "recipe.yaml"
    again = import_recipe(recipe)  # the recipe as it ran, read back as a profile
    assert again.profile["args"] == run["report"]["engine"]["args"]
    assert again.profile["model"] == str(tiny_llama())


def test_the_context_came_from_the_engines_prefix_cache(run: dict[str, Any]) -> None:
    cells = {(c["depth"], c["concurrency"]): c for c in run["report"]["cells"]}
    for concurrency in (1, 2):
        deep = cells[DEPTH, concurrency]
        assert len(deep["context_runs"]) == RUNS and deep["prompt_tokens"] == DEPTH + 32
        # vLLM's own counter, over the measured requests only (the loads left out).
        assert deep["prefix_cache_hit_tokens"] == DEPTH * RUNS * concurrency, deep
        assert not any("prefix caching" in flag for flag in deep["flags"])
        assert deep["accept_len"] is not None and deep["accept_len"] > 1.0
        shallow = cells[0, concurrency]
        assert shallow["context_runs"] == [] and shallow["prefix_cache_hit_tokens"] == 0


@pytest.mark.upstream
def test_the_submission_validates_against_llama_benchys_schema(
    run: dict[str, Any], tmp_path: Path
) -> None:
    root: Path = run["dir"]
    report_json = root / "logs" / "benchmark.json"
    checked = check_schema(report_json, report_schema(tmp_path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    ours = (root / "logs" / "benchmark.csv").read_text()
    assert ours == csv_of(report_json, tmp_path / "theirs.csv")
    names = [line.split(",")[1] for line in ours.splitlines()[1:]]
    # Run order, each context load before its cell. A cell's tg row is there only when a
    # client decode rate was measured (a busy host delivers streams in bursts, and a burst
    # run reports none: llama-benchy, too, writes no tg row without a tg throughput).
    deep = [f"ctx_pp @ d{DEPTH} (c1)", f"pp32 @ d{DEPTH} (c1)",
            f"ctx_pp @ d{DEPTH} (c2)", f"pp32 @ d{DEPTH} (c2)"]  # fmt: skip
    assert [n for n in names if "tg" not in n] == ["pp32 (c1)", "pp32 (c2)", *deep]
    for at, name in enumerate(names):
        if "tg" in name:
            assert names[at - 1] == name.replace("tg16", "pp32").replace("ctx_tg", "ctx_pp")
    for cell in run["report"]["cells"]:
        decode = cell["decode_tps_aggregate" if cell["concurrency"] > 1 else "decode_tps_request"]
        at_depth = f" @ d{cell['depth']}" if cell["depth"] else ""
        assert (f"tg16{at_depth} (c{cell['concurrency']})" in names) == (decode["n"] > 0), cell
