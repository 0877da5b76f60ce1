"""Spark Arena's side of bench, without an engine: the official sweep, the checks made before
a boot, and the submission written from a report (the same code on a real CPU vLLM run is
tests/test_bench_arena_engine.py).

llama-benchy's formats are held against llama-benchy 0.4.0 itself (PyPI, cached venv):
its JSON schema is its ``BenchmarkReport`` model's (the schema file its repository ships is
generated from that model), and its CSV is what its own writer makes of our JSON.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkbuild.bench import arena, llama_benchy
from sparkbuild.bench.client import StreamResult
from sparkbuild.bench.report import load_report
from sparkbuild.bench.results import (
    BenchReport,
    CellResult,
    EngineInfo,
    HarnessInfo,
    HostInfo,
    TargetInfo,
    cell_stats,
    run_figures,
)
from sparkbuild.bench.sweep import Scheduled, Sweep
from sparkbuild.engines.profiles import SmokeProfile
from sparkbuild.engines.recipes import import_recipe
from sparkbuild.errors import UsageError
from tests.support.cli import RunCli
from tests.support.hostile_http import HostileServer, Reply
from tests.support.llama_benchy import (
    check_schema,
    csv_of,
    report_schema,
    sample_json,
    write_outputs,
)
from tests.support.sparkrun_peer import Sparkrun, sparkrun_or_skip

ROOT = Path(__file__).resolve().parents[1]
PP, TG, DEPTH = 32, 16, 64
SPEC = '{"method":"ngram","num_speculative_tokens":3}'


def _stream(start: float, ttft: float, gap: float, prompt: int) -> StreamResult:
    times = tuple(start + ttft + i * gap for i in range(TG))
    return StreamResult(
        sent=start, first_token=times[0], last_token=times[-1], done=times[-1] + 0.001,
        prompt_tokens=prompt, completion_tokens=TG, finish_reason="length",
        chunk_times=times, chunk_tokens=tuple(range(1, TG + 1)),
    )  # fmt: skip


def _cell(depth: int, concurrency: int) -> CellResult:
    """Two runs; with depth, each run's context load before it (prefix caching)."""
    figures = [
        run_figures([_stream(0.0, 0.04 + 0.01 * run, 0.008, depth + PP)] * concurrency,
                    prefill_tokens=PP if depth else None)
        for run in range(2)
    ]  # fmt: skip
    loads = [run_figures([_stream(0.0, 0.2, 0.01, depth)] * concurrency)] * 2 if depth else []
    stats = cell_stats(figures)
    return CellResult(
        pp=PP, tg=TG, depth=depth, concurrency=concurrency, ttft_s=stats["ttft_s"],
        prefill_tps=stats["prefill_tps"], decode_tps_request=stats["decode_tps_request"],
        decode_tps_aggregate=stats["decode_tps_aggregate"], output_tps=stats["output_tps"],
        prefill_tps_aggregate=stats["prefill_tps_aggregate"], accept_len=2.5,
        prompt_tokens_target=depth + PP, prompt_tokens=depth + PP, completion_tokens=TG,
        requests=2 * concurrency, errors=0, runs=figures, context_runs=loads,
    )  # fmt: skip


def _report() -> BenchReport:
    cells = [_cell(depth, c) for depth in (0, DEPTH) for c in (1, 2)]
    return BenchReport(
        created="2026-11-22T01:00:00+0000", label="cpu run", profile="cpu",
        harness=HarnessInfo(version="1", sparkbuild="0.1.0", http_client="httpx"),
        host=HostInfo(hostname="h", platform="p", machine="x86_64", cpus=2, python="3.11"),
        target=TargetInfo(kind="command", value="python -m vllm.entrypoints.openai.api_server"),
        engine=EngineInfo(
            name="vllm", version="0.32.0", model="tiny/llama", served_model="tiny/llama",
            args=["--dtype", "bfloat16", "--max-model-len", "1024", "--speculative-config", SPEC],
            env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_TOKEN": "hf_secret"},
        ),
        sweep=Sweep(pp=[PP], tg=[TG], depth=[0, DEPTH], concurrency=[1, 2], runs=2,
                    prefix_caching=True),
        seconds=80.0, boot_seconds=30.0, complete=True, cells=cells,
    )  # fmt: skip


PROFILE = SmokeProfile(engine="vllm", model="tiny/llama", description="CPU reference")


# --- the official sweep ------------------------------------------------------------------


def test_spark_arena_v2_runs_the_official_grid_in_its_fixed_order() -> None:
    named = arena.named_sweep("spark-arena-v2")
    sweep = named.sweep(seed=3)
    cells = list(sweep.cells())
    assert sweep.prefix_caching and sweep.runs == 3 and sweep.name == "spark-arena-v2"
    assert len(cells) == sweep.cell_count == 28
    assert {(c.pp, c.tg) for c in cells} == {(2048, 128)}
    assert [(c.depth, c.concurrency) for c in cells] == named.schedule
    assert cells[0].label() == "pp=2048 tg=128 depth=8192 c=5"  # heat-aware, not grid order
    assert {c.depth for c in cells} == {0, 4096, 8192, 16384, 32768, 65535, 100000}
    assert {c.concurrency for c in cells} == {1, 2, 5, 10}
    assert named.profile == "@official/spark-arena-v2"


def test_a_schedule_must_cover_the_grid_once() -> None:
    with pytest.raises(ValueError, match="every \\(depth, concurrency\\) pair once"):
        Sweep(depth=[0, 1], concurrency=[1], schedule=[Scheduled(depth=0, concurrency=1)])


def _bench(run_cli: RunCli, *args: str) -> Any:
    return run_cli("--project", str(ROOT), "bench", *args)


def test_cells_the_profile_cannot_hold_are_refused_before_boot(run_cli: RunCli) -> None:
    # `false` would exit at once: the refusal must come before anything is started.
    result = _bench(run_cli, "--command", "false", "--profile", "cpu-reference",
                    "--sweep", "spark-arena-v2")  # fmt: skip
    assert result.exit_code == 2, result.output
    assert (
        "error: profile cpu-reference (vllm) serves at most 1024 tokens, and 28 of the 28 "
        "cells of --sweep spark-arena-v2 need more (depth 8192 c5, depth 4096 c5"
    ) in result.stderr
    assert "up to depth+pp+tg = 102176)" in result.stderr
    assert "hint: serve with a context of at least 102176 tokens (e.g. --max-model-len 102176)" in (
        result.stderr
    )
    assert "waiting for" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sweep", "spark-arena-v2", "--pp", "512"], "--sweep spark-arena-v2 fixes the grid; "
         "--pp would be ignored"),
        (["--sweep", "nope"], "Invalid value for '--sweep'"),
        (["--url", "http://127.0.0.1:9", "--arena", "out"], "--arena needs --profile"),
    ],
)  # fmt: skip
def test_bench_arena_usage_errors(run_cli: RunCli, args: list[str], message: str) -> None:
    result = _bench(run_cli, *args)
    assert result.exit_code == 2 and message in result.output, result.output


def test_an_arena_directory_in_use_is_refused_before_boot(run_cli: RunCli, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mine.txt").write_text("keep")
    result = _bench(run_cli, "--command", "false", "--profile", "cpu-reference",
                    "--arena", str(tmp_path / "sub"))  # fmt: skip
    assert result.exit_code == 2
    assert "exists and is not an empty directory" in result.stderr
    assert (tmp_path / "sub" / "mine.txt").read_text() == "keep"


# --- the submission ----------------------------------------------------------------------


@pytest.fixture
def submission(tmp_path: Path) -> arena.Submission:
    return arena.write_submission(tmp_path / "sub", _report(), "cpu", PROFILE)


def test_a_submission_has_spark_arenas_layout_and_metadata_keys(
    submission: arena.Submission,
) -> None:
    root = submission.directory
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == [
        "logs/benchmark.csv", "logs/benchmark.json", "logs/sparkbuild-bench.json",
        "metadata/metadata.json", "recipes/recipe.yaml",
    ]  # fmt: skip
    meta = json.loads((root / "metadata" / "metadata.json").read_text())
    # The keys sparkrun's BenchmarkResult.generate_metadata writes (sparkbuild's own beside).
    assert set(meta) == {"recipe", "timing", "cluster", "benchmark", "model", "runtime_info",
                         "sparkrun", "sparkbuild"}  # fmt: skip
    assert set(meta["recipe"]) == {
        "name", "qualified_name", "type", "model", "hf_model", "raw_container", "container",
        "container_pinned", "runtime", "runtime_full", "registry", "registry_git", "hash",
        "text", "effective_hash",
    }  # fmt: skip
    # No sparkrun ran: its layout, not its version. Hosts only as pseudonyms.
    assert meta["sparkrun"] == {"version": None, "format": "0.4.2"}
    assert meta["cluster"]["hosts"] == ["node-" + hashlib.sha256(b"h").hexdigest()[:8]]
    assert meta["cluster"]["hosts_redacted"] is True
    assert meta["benchmark"]["category"] == "performance" and meta["benchmark"]["resumed"] is False
    recipe_text = (root / "recipes" / "recipe.yaml").read_text()
    assert meta["recipe"]["hash"] == hashlib.sha256(recipe_text.encode()).hexdigest()
    assert meta["timing"] == {"start": "2026-11-22T00:59:10+00:00",
                              "end": "2026-11-22T01:00:00+00:00", "duration": 50.0}  # fmt: skip
    assert meta["benchmark"]["framework"] == "sparkbuild-bench"  # not llama-benchy's figures
    assert meta["benchmark"]["args"]["prefix_caching"] is True
    assert meta["runtime_info"] == {"vllm": "0.32.0"}
    assert meta["cluster"]["node_count"] == 1


def test_the_csv_has_llama_benchys_columns_only_and_its_context_rows(
    submission: arena.Submission,
) -> None:
    rows = list(csv.DictReader(io.StringIO(submission.files["csv"].read_text())))
    assert list(rows[0]) == list(llama_benchy.CSV_COLUMNS)
    assert [r["test_name"] for r in rows] == [
        "pp32 (c1)", "tg16 (c1)", "pp32 (c2)", "tg16 (c2)",
        "ctx_pp @ d64 (c1)", "ctx_tg @ d64 (c1)", "pp32 @ d64 (c1)", "tg16 @ d64 (c1)",
        "ctx_pp @ d64 (c2)", "ctx_tg @ d64 (c2)", "pp32 @ d64 (c2)", "tg16 @ d64 (c2)",
    ]  # fmt: skip
    # With the context in the prefix cache, prefill counts the prompt's own 32 tokens:
    # 32 / 0.04 s and 32 / 0.05 s, mean 720 tok/s (not (64 + 32) / TTFT).
    pp_d64 = next(r for r in rows if r["test_name"] == "pp32 @ d64 (c1)")
    assert float(pp_d64["t_s_mean"]) == pytest.approx(720.0)
    assert float(pp_d64["e2e_ttft_mean"]) == pytest.approx(45.0)


def test_the_recipe_is_what_ran_and_imports_back(submission: arena.Submission) -> None:
    path = submission.files["recipe"]
    data = yaml.safe_load(path.read_text())
    assert list(data) == ["recipe_version", "model", "runtime", "metadata", "defaults", "env",
                          "command"]  # fmt: skip
    assert data["env"] == {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_TOKEN": "***"}
    assert "hf_secret" not in "".join(p.read_text() for p in submission.files.values())
    again = import_recipe(path)
    assert again.profile["args"] == _report().engine.args
    assert again.profile["model"] == "tiny/llama" and again.profile["expect"]["speculation"]


def test_an_incomplete_sweep_is_no_submission(tmp_path: Path) -> None:
    broken = _report().model_copy(update={"complete": False, "error": "engine died"})
    with pytest.raises(UsageError, match="incomplete sweep is not a submission"):
        arena.write_submission(tmp_path / "sub", broken, "cpu", PROFILE)
    assert not (tmp_path / "sub").exists()


@pytest.mark.parametrize("status", [500, 503])
def test_a_sweep_that_measured_nothing_is_no_submission(
    run_cli: RunCli, tmp_path: Path, status: int
) -> None:
    """Issue 34, What 5: an engine that answers every completion with an error made a
    complete-looking submission of a sweep with no figure in it. Refused now, naming why, and
    nothing is written at --arena."""
    project = tmp_path / "project"
    (project / "smoke").mkdir(parents=True)
    (project / "smoke" / "p.yaml").write_text(
        "engine: vllm\nmodel: tiny\nprompts: [prose]\n"
        "expect: {max_tokens: 4, speculation: false, finish: length, repetition: null}\n"
    )
    models = {"data": [{"id": "tiny", "owned_by": "vllm", "max_model_len": 4096}]}
    with HostileServer() as engine:
        engine.route("/health", Reply(body=b"{}"))
        engine.route("/v1/models", Reply(body=json.dumps(models).encode()))
        engine.route("/metrics", Reply(body=b"", content_type="text/plain"))
        engine.route("/version", Reply(body=b'{"version": "0.0-failing"}'))
        engine.route(
            "/tokenize",
            lambda r: Reply(
                body=json.dumps({"count": len(json.loads(r.body)["prompt"].split())}).encode()
            ),
        )
        engine.route("/v1/completions", Reply(status=status, body=b'{"error": "no"}'))
        result = run_cli(
            "--project", str(project), "bench", "--url", engine.url, "--profile", "p",
            "--pp", "8", "--tg", "2", "-c", "1", "--runs", "1", "--no-warmup",
            "--arena", str(tmp_path / "arena"),
        )  # fmt: skip

    assert result.exit_code == 1, result.output
    said = " ".join(result.stderr.split())
    assert "no Spark Arena submission: nothing was measured" in said, said
    assert "pp=8 tg=2 depth=0 c=1: 1 of 1 requests failed" in said, said
    assert not (tmp_path / "arena").exists()
    assert not list(tmp_path.glob(".arena-*"))  # no scratch either


@pytest.mark.upstream
def test_the_json_validates_against_llama_benchys_schema(
    submission: arena.Submission, tmp_path: Path
) -> None:
    schema = report_schema(tmp_path)
    ok = check_schema(submission.files["llama_benchy_json"], schema)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # The schema can fail: a run without its required concurrency does not validate.
    broken = json.loads(submission.files["llama_benchy_json"].read_text())
    del broken["benchmarks"][0]["concurrency"]
    bad = tmp_path / "broken.json"
    bad.write_text(json.dumps(broken))
    refused = check_schema(bad, schema)
    assert refused.returncode != 0 and "concurrency" in refused.stdout


@pytest.mark.upstream
def test_the_csv_is_what_llama_benchy_writes_for_the_json(
    submission: arena.Submission, tmp_path: Path
) -> None:
    theirs = csv_of(submission.files["llama_benchy_json"], tmp_path / "theirs.csv")
    assert submission.files["csv"].read_text() == theirs


# --- llama-benchy CSV in bench compare --------------------------------------------------


@pytest.mark.upstream
def test_compare_takes_llama_benchys_own_csv(run_cli: RunCli, tmp_path: Path) -> None:
    benchy = write_outputs(tmp_path / "benchy")
    report = load_report(benchy["csv"])
    assert report.harness.name == "llama-benchy" and report.engine.model == "tiny/llama"
    assert {(c.depth, c.concurrency) for c in report.cells} == {(0, 1), (0, 2), (64, 1), (64, 2)}
    from_json = load_report(benchy["json"])
    for cell in report.cells:
        same = from_json.cell(cell.key)
        assert same is not None
        assert cell.decode_tps_request.median == pytest.approx(same.decode_tps_request.median)
        assert cell.ttft_s.median == pytest.approx(same.ttft_s.median)
    out = tmp_path / "compare.json"
    result = run_cli("bench", "compare", str(benchy["csv"]), str(benchy["json"]),
                     "--json-file", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert len(json.loads(out.read_text())["cells"]) == 4


@pytest.mark.upstream
def test_compare_reads_prefix_caching_from_llama_benchys_own_sample(
    run_cli: RunCli, tmp_path: Path
) -> None:
    sample = sample_json()
    assert json.loads(sample.read_text())["prefix_caching_enabled"] is True
    assert load_report(sample).sweep.prefix_caching is True
    # Against a run without it, compare names the difference (it used to read "off" twice).
    ours = tmp_path / "ours.json"
    plain = _report().model_copy(update={"sweep": _report().sweep.model_copy(
        update={"prefix_caching": False})})  # fmt: skip
    ours.write_text(plain.model_dump_json())
    result = run_cli("bench", "compare", str(ours), str(sample))
    assert "warning: prefix caching differs: False vs True" in result.stderr, result.output


def test_our_submission_csv_compares_with_its_report(
    submission: arena.Submission, run_cli: RunCli, tmp_path: Path
) -> None:
    out = tmp_path / "compare.json"
    result = run_cli("bench", "compare", str(submission.files["report"]),
                     str(submission.files["csv"]), "--json-file", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["cells"]
    assert len(rows) == 4
    c1 = next(r for r in rows if (r["depth"], r["concurrency"]) == (0, 1))
    assert c1["decode tok/s/req"]["b"] == pytest.approx(c1["decode tok/s/req"]["a"], rel=1e-3)


def test_a_csv_that_is_not_llama_benchys_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(",".join(llama_benchy.CSV_COLUMNS) + "\nm,throughput,1,0\n")
    expected = r"bad\.csv is not a sparkbuild bench report .* line 2: test_name 'throughput'"
    with pytest.raises(UsageError, match=expected):
        load_report(bad)


@pytest.mark.parametrize(("kind", "launched"), [("command", True), ("url", False)])
def test_the_recipe_holds_the_flags_the_launcher_ran_with(kind: str, launched: bool) -> None:
    """An SGLang run launched by sparkbuild ran with --enable-metrics, which its profile need
    not list: the submission's recipe says so (it left it out); of an engine at a URL, only
    what the report knows."""
    engine = EngineInfo(name="sglang", version="0.5.23", model="org/m", served_model="org/m",
                        args=["--tp", "1"])  # fmt: skip
    report = _report().model_copy(update={
        "engine": engine, "target": TargetInfo(kind=kind, value="http://127.0.0.1:30000"),
    })  # fmt: skip
    profile = SmokeProfile(engine="sglang", model="org/m")
    lines = str(arena.effective_recipe(report, "p", profile)["command"]).split(" \\\n")
    assert [line.strip() for line in lines[3:]] == [
        *(["--enable-metrics"] if launched else []), "--tp {tensor_parallel}",
    ]  # fmt: skip


def test_an_image_run_names_its_digest_and_the_recipe_it_was_imported_from(
    tmp_path: Path,
) -> None:
    imported = import_recipe(ROOT / "tests" / "data" / "recipes" / "qwen3.6-27b-fp8-vllm.yaml")
    profile = SmokeProfile.model_validate(imported.profile)
    digest = "127.0.0.1:5000/sparkbuild/vllm@sha256:" + "cd" * 32
    report = _report().model_copy(update={"target": TargetInfo(
        kind="image", value="127.0.0.1:5000/sparkbuild/vllm:0.32-spark",
        image_id="sha256:" + "ab" * 32, repo_digests=[digest],
    )})  # fmt: skip
    done = arena.write_submission(tmp_path / "sub", report, "qwen", profile)
    recipe = yaml.safe_load(done.files["recipe"].read_text())
    assert recipe["container"] == digest and recipe["runtime"] == "vllm-distributed"
    origin = recipe["metadata"]["sparkbuild"]["imported_from"]
    assert origin["sha256"] == imported.source.sha256
    meta = json.loads(done.files["metadata"].read_text())["recipe"]
    assert (meta["container"], meta["container_pinned"]) == (digest, True)
    assert meta["raw_container"] == "ghcr.io/spark-arena/dgx-vllm-eugr-nightly:latest"
    assert meta["name"] == "qwen3.6-27b-fp8-vllm" and meta["runtime_full"] == "vllm-distributed"


# --- held against sparkrun 0.4.2's own code -----------------------------------------------


@pytest.fixture(scope="module")
def sparkrun(tmp_path_factory: pytest.TempPathFactory) -> Sparkrun:
    return sparkrun_or_skip(tmp_path_factory.mktemp("sparkrun"))


def _image_submission(tmp_path: Path) -> arena.Submission:
    """A run of an image pinned by digest, from a profile imported from a recipe."""
    imported = import_recipe(ROOT / "tests" / "data" / "recipes" / "qwen3.6-27b-fp8-vllm.yaml")
    profile = SmokeProfile.model_validate(imported.profile)
    report = _report().model_copy(update={"target": TargetInfo(
        kind="image", value="127.0.0.1:5000/sparkbuild/vllm:0.32-spark",
        image_id="sha256:" + "ab" * 32,
        repo_digests=["127.0.0.1:5000/sparkbuild/vllm@sha256:" + "cd" * 32],
    )})  # fmt: skip
    return arena.write_submission(tmp_path / "image-sub", report, "qwen", profile)


@pytest.mark.upstream
def test_sparkrun_takes_our_submissions_recipe_without_a_question(
    sparkrun: Sparkrun, submission: arena.Submission, tmp_path: Path
) -> None:
    recipes = [submission.files["recipe"], _image_submission(tmp_path).files["recipe"]]
    # The recipe sparkbuild wrote before: a serve flag sparkrun reads, hardcoded.
    hardcoded = tmp_path / "hardcoded.yaml"
    text = submission.files["recipe"].read_text()
    hardcoded.write_text(text.replace("--max-model-len {max_model_len}", "--max-model-len 1024")
                         .replace("  max_model_len: 1024\n", ""))  # fmt: skip
    asked = sparkrun.ask(
        [{"op": op, "path": str(p)} for p in (*recipes, hardcoded) for op in ("validate",
                                                                                "submission")]
    )  # fmt: skip
    for validated, gate in zip(asked[0:4:2], asked[1:4:2], strict=True):
        assert validated == {"issues": []}  # `recipe validate --strict`: nothing at all
        assert gate == {"said": [], "asked": [], "error": None}  # no "Continue?"
    # The gate can refuse: the hardcoded flag is a suggestion, and its question's default
    # answer (No) stops the submission.
    validated, gate = asked[4:]
    assert [i["code"] for i in validated["issues"]] == ["hardcoded-serve-flag"]
    assert gate["asked"] == ["Continue with the benchmark and submission?"]
    assert gate["error"] == "BenchmarkFailed: Aborted."


@pytest.mark.upstream
def test_sparkrun_renders_our_recipe_to_the_flags_that_ran(
    sparkrun: Sparkrun, submission: arena.Submission
) -> None:
    rendered = sparkrun.one({"op": "render", "path": str(submission.files["recipe"])})
    argv = rendered["argv"]
    assert argv[:3] == ["vllm", "serve", "tiny/llama"]
    assert argv[3:7] == ["--host", "0.0.0.0", "--port", "8000"]
    # sparkrun names the served model itself when the template does not.
    assert argv[7:-2] == _report().engine.args and argv[-2:] == [
        "--served-model-name",
        "tiny/llama",
    ]
    assert rendered["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"


def _nested_keys(data: Any, prefix: str = "") -> set[str]:
    if not isinstance(data, dict):
        return set()
    found: set[str] = set()
    for key, value in data.items():
        found |= {f"{prefix}{key}"} | _nested_keys(value, f"{prefix}{key}.")
    return found


@pytest.mark.upstream
@pytest.mark.parametrize("kind", ["command", "image"])
def test_our_metadata_has_every_key_sparkrun_writes_and_its_hashes(
    sparkrun: Sparkrun, submission: arena.Submission, tmp_path: Path, kind: str
) -> None:
    done = submission if kind == "command" else _image_submission(tmp_path)
    ours = json.loads(done.files["metadata"].read_text())
    theirs = sparkrun.one({
        "op": "metadata", "path": str(done.files["recipe"]),
        "start": ours["timing"]["start"], "end": ours["timing"]["end"],
        "cluster_id": ours["cluster"]["cluster_id"], "hosts": ["h"],
        "container": ours["recipe"]["container"], "pinned": ours["recipe"]["container_pinned"],
        "runtime_info": ours["runtime_info"], "profile": ours["benchmark"]["profile"],
        "args": ours["benchmark"]["args"], "framework": ours["benchmark"]["framework"],
    })["metadata"]  # fmt: skip
    assert _nested_keys(theirs) - _nested_keys(ours) == set()
    same = ("hash", "effective_hash", "text", "container", "container_pinned", "runtime")
    for key in (*same, "runtime_full"):
        assert ours["recipe"][key] == theirs["recipe"][key], key
    assert ours["cluster"]["hosts"] == theirs["cluster"]["hosts"]  # the same pseudonym
    assert ours["timing"] == {k: theirs["timing"][k] for k in ("start", "end", "duration")}
    assert theirs["sparkrun"] == {"version": "0.4.2"} and ours["sparkrun"]["version"] is None


@pytest.mark.upstream
def test_sparkruns_csv_writer_makes_our_csv(
    sparkrun: Sparkrun, submission: arena.Submission
) -> None:
    answer = sparkrun.one(
        {"op": "csv", "benchmark_json": str(submission.files["llama_benchy_json"])}
    )
    ours = submission.files["csv"].read_text()
    # Line for line the same; sparkrun's csv module ends lines with CRLF, llama-benchy's own
    # writer (which ours matches byte for byte) with LF.
    assert answer["csv"] == ours.replace("\n", "\r\n")


def _arena_report(left_out: set[tuple[int, int]]) -> BenchReport:
    """A complete-looking spark-arena-v2 run, less the (depth, concurrency) cells named."""
    named = arena.named_sweep("spark-arena-v2")
    cells = [
        _cell(d, c).model_copy(update={"pp": 2048, "tg": 128})
        for d, c in named.schedule
        if (d, c) not in left_out
    ]
    return _report().model_copy(update={"sweep": named.sweep(), "cells": cells})


@pytest.mark.upstream
def test_sparkruns_resume_logic_sees_every_cell_of_a_spark_arena_v2_sweep(
    sparkrun: Sparkrun, tmp_path: Path
) -> None:
    named = arena.named_sweep("spark-arena-v2")
    gaps = {(65535, 10), (100000, 1), (0, 2)}
    requests = []
    for name, left_out in (("whole", set()), ("gaps", gaps)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(llama_benchy.to_json(_arena_report(left_out))))
        requests.append({
            "op": "resume", "benchmark_json": str(path),
            "args": named.benchmark_args(),
            "schedule": [{"depth": d, "concurrency": c} for d, c in named.schedule],
        })  # fmt: skip
    whole, holed = sparkrun.ask(requests)
    assert [tuple(t) for t in whole["tasks"]] == named.schedule
    assert len(whole["covered"]) == 28 and whole["missing"] == []
    assert {tuple(t) for t in holed["missing"]} == gaps  # the check can fail


@pytest.mark.parametrize(
    "model", ['=HYPERLINK("http://x.invalid","m")', "+1+cmd", "-2+3", "@SUM(A1)"]
)
def test_a_model_name_that_is_a_formula_is_written_as_text(model: str) -> None:
    """Issue 34, low: the engine's model name went into the CSV we write as it came, and a
    spreadsheet opening the file ran it as a formula. Both CSVs (``--csv`` and the
    submission's) write it as text: a leading ``'``."""
    report = _report()
    engine = report.engine.model_copy(update={"model": model, "served_model": model})
    report = report.model_copy(update={"engine": engine})
    for text in (
        llama_benchy.to_csv(report),
        llama_benchy.json_to_csv(llama_benchy.to_json(report)),
    ):
        models = {row["model"] for row in csv.DictReader(io.StringIO(text))}
        assert models == {"'" + model}, text
