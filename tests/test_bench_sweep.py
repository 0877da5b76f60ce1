"""`sparkbuild bench` end to end against real vLLM on the CPU (tiny random-weight Llama).

Two engines per module: one booted by `bench --command` itself (n-gram speculation on) and
one started here and reached with `bench --url` (speculation off); the second one also serves
a spark-arena-v2-shaped sweep interrupted and resumed, and is killed in the middle of a sweep
in the last test. Each boot takes 20-40 s on two cores.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from sparkbuild import lockfile
from sparkbuild.adapters import adapter_for
from sparkbuild.bench.checkpoint import UNFINISHED
from sparkbuild.engines.targets import ProcessTarget, free_port, wait_ready
from tests.support.burst_proxy import BurstProxy
from tests.support.cli import installed_entry_point, run_cli
from tests.support.vllm_cpu import (
    ENGINE_ARGS,
    ENGINE_ENV,
    NGRAM,
    tiny_llama,
    vllm_cpu_python,
    vllm_server_command,
)

pytestmark = pytest.mark.engine

SWEEP = ["--pp", "32,64", "--tg", "16", "--depth", "0", "--concurrency", "1,2", "--runs", "2"]
CELLS = {(pp, 16, 0, c) for pp in (32, 64) for c in (1, 2)}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
IMAGE_ID = "sha256:" + "ab" * 32


def _profile(project: Path, name: str, speculation: bool) -> None:
    args = [*ENGINE_ARGS, *(["--speculative-config", NGRAM] if speculation else [])]
    profile = {
        "engine": "vllm",
        "model": str(tiny_llama()),
        "args": args,
        "env": ENGINE_ENV,
        "expect": {"boot_timeout_s": 600},
        "container": {"gpus": "none"},
    }
    (project / "smoke").mkdir(parents=True, exist_ok=True)
    (project / "smoke" / f"{name}.yaml").write_text(yaml.safe_dump(profile), encoding="utf-8")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bench-project")
    _profile(root, "cpu-spec", speculation=True)
    _profile(root, "cpu-plain", speculation=False)
    lockfile.set_section(root / "images.lock", "cpu", lockfile.ImageSection(image_id=IMAGE_ID))
    return root


def _bench(project: Path, *args: str) -> Any:
    return run_cli("--project", str(project), "--quiet", "bench", *args)


@pytest.fixture(scope="module")
def plain_server(project: Path) -> Iterator[ProcessTarget]:
    """vLLM without speculation, started here (the sweep reaches it with --url)."""
    port = free_port()
    argv = [
        str(vllm_cpu_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        *adapter_for("vllm").serve_args(str(tiny_llama()), "127.0.0.1", port, list(ENGINE_ARGS)),
    ]
    target = ProcessTarget(argv, port=port, env=ENGINE_ENV, log_path=project / "plain.log")
    with target:
        readiness = wait_ready(target, adapter_for("vllm"), 600)
        assert readiness.ready, f"vLLM did not boot: {target.logs.tail(20) if target.logs else ''}"
        yield target


@pytest.fixture(scope="module")
def spec_report(project: Path) -> dict[str, Any]:
    """`bench --command` with n-gram speculation, recorded in images.lock."""
    out = project / "spec"
    result = _bench(
        project,
        "--command",
        vllm_server_command(),
        "--profile",
        "cpu-spec",
        *SWEEP,
        "--json-file",
        f"{out}.json",
        "--markdown",
        f"{out}.md",
        "--plot",
        f"{out}.png",
        "--record",
        "cpu",
    )
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(Path(f"{out}.json").read_text())
    return data


@pytest.fixture(scope="module")
def plain_report(project: Path, plain_server: ProcessTarget) -> dict[str, Any]:
    out = project / "plain.json"
    result = _bench(
        project,
        "--url",
        plain_server.base_url,
        "--profile",
        "cpu-plain",
        *SWEEP,
        "--json-file",
        str(out),
    )
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def _cells(report: dict[str, Any]) -> dict[tuple[int, int, int, int], dict[str, Any]]:
    return {(c["pp"], c["tg"], c["depth"], c["concurrency"]): c for c in report["cells"]}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pp", "0"], "Invalid value for '--pp': 0 is below the minimum 1"),
        (["--concurrency", "a"], "'a' is not a whole number"),
        (["--tg", "16,,32"], "empty item"),
        (["--depth", "-5"], "below the minimum 0"),
        (["--runs", "0"], "--runs"),
    ],
)
def test_malformed_sweep_arguments_exit_2(project: Path, args: list[str], message: str) -> None:
    result = _bench(project, "--url", "http://127.0.0.1:9", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_sweep_with_speculation_reports_every_cell(
    project: Path, spec_report: dict[str, Any]
) -> None:
    cells = _cells(spec_report)
    assert set(cells) == CELLS
    assert spec_report["complete"] is True
    assert spec_report["engine"]["args"][-2:] == ["--speculative-config", NGRAM]
    assert spec_report["prompts"]["exact"] is True
    for cell in cells.values():
        assert cell["errors"] == 0, cell["error_samples"]
        assert cell["accept_len"] is not None and cell["accept_len"] > 1.0
        assert cell["prompt_tokens"] == cell["pp"]  # hit to the token, by the engine's count
        assert cell["completion_tokens"] == 16
        assert cell["prefix_cache_hit_tokens"] == 0  # every request has its own prefix
        # The engine's own counter saw exactly the tokens the harness counted from usage.
        assert cell["engine_generation_tokens"] == 16 * cell["concurrency"] * 2
        # A burst run (a busy host) reports no client decode rate; the engine's is always there.
        trusted = 2 - cell["burst_runs"]
        expected = {"ttft_s": 2, "prefill_tps": 2, "decode_tps_engine": 2,
                    "decode_tps_request": trusted, "decode_tps_aggregate": trusted}  # fmt: skip
        for metric, runs in expected.items():
            stat = cell[metric]
            assert stat["n"] == runs, (metric, cell["flags"])
            assert runs == 0 or stat["min"] <= stat["median"] <= stat["max"], metric
        assert cell["engine"]["source"] == "vllm:request_time_per_output_token_seconds"
        assert cell["engine"]["requests"] == 2 * cell["concurrency"]
    markdown = (project / "spec.md").read_text()
    assert markdown.count("\n| 32 | 16 | 0 |") + markdown.count("\n| 64 | 16 | 0 |") == 4
    png = (project / "spec.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE)
    assert len(png) > 10_000  # a real figure with axes, lines and a legend


def test_record_stores_summary_beside_smoke(project: Path, spec_report: dict[str, Any]) -> None:
    entry = lockfile.load(project / "images.lock").to_json()["builds"].get("cpu")
    assert entry is not None
    summary = entry["bench"][IMAGE_ID]["cpu-spec"]
    assert summary["harness"] == spec_report["harness"]["version"]
    assert len(summary["cells"]) == 4
    assert all(c["accept_len"] > 1.0 for c in summary["cells"])
    assert entry["image"] == {"image_id": IMAGE_ID}  # the image stage's key is left alone
    # The bench verdict names its host and what the run took of its memory, per phase.
    (node,) = summary["hosts"]["nodes"]
    assert node["node"] == "this host" and node["facts"]["kernel"] == platform.release()
    assert node["taken_gib"] and [p["phase"] for p in summary["hosts"]["phases"]][-1] == "serving"
    memory = spec_report["host_facts"]["memory"]
    assert memory["stopped"] is None and memory["nodes"][0]["samples"] > 0
    assert spec_report["host_facts"]["nodes"][0]["unknown"]["nccl"].startswith("a --command run")


def test_a_url_run_reads_no_host(plain_report: dict[str, Any]) -> None:
    assert plain_report["host_facts"] is None  # someone else's engine, on someone else's box


def test_sweep_without_speculation_has_no_acceptance(plain_report: dict[str, Any]) -> None:
    cells = _cells(plain_report)
    assert set(cells) == CELLS
    for cell in cells.values():
        assert cell["errors"] == 0
        assert cell["accept_len"] is None  # no drafts: null, never a made-up 1.0
        assert cell["speculation"] is None
        assert cell["decode_tps_engine"]["median"] > 0  # the engine's own rate, always
        client = cell["decode_tps_aggregate"]["median"]
        # A busy host can deliver every run in one burst: then no client rate, and flagged.
        assert client > 0 if client is not None else cell["burst_runs"] == len(cell["runs"])


def test_compare_reports_the_difference(
    project: Path, spec_report: dict[str, Any], plain_report: dict[str, Any]
) -> None:
    result = _bench(
        project,
        "compare",
        str(project / "plain.json"),
        str(project / "spec.json"),
        "--json-file",
        str(project / "compare.json"),
        "--plot",
        str(project / "compare.png"),
    )
    assert result.exit_code == 0, result.output
    data = json.loads((project / "compare.json").read_text())
    assert data["subject"].startswith("engine arguments")
    # Same harness, seed, prompts, cells, runs and host; only what a busy host changes between
    # the two runs (bursts, the load average) may show.
    busy = ("burst runs", "the hosts' load differs")
    assert [w for w in data["warnings"] if not any(b in w for b in busy)] == []
    assert {(r["pp"], r["tg"], r["depth"], r["concurrency"]) for r in data["cells"]} == CELLS
    for row in data["cells"]:
        accept = row["accept len"]
        assert accept["a"] is None and accept["b"] > 1.0
        decode = row["engine tok/s/req"]  # never discarded, unlike a burst's client rate
        expected = round((decode["b"] - decode["a"]) / decode["a"] * 100, 2)
        assert decode["delta_pct"] == expected
    assert (project / "compare.png").read_bytes().startswith(PNG_SIGNATURE)
    shown = _bench(project, "compare", str(project / "plain.json"), str(project / "spec.json"))
    assert "accept" in shown.output
    # A delta in the terminal table, unless bursts withheld the client rates it shows.
    assert "%)" in shown.output or "burst runs (client decode rate discarded)" in shown.output


def test_compare_warns_about_other_differences(
    project: Path, spec_report: dict[str, Any], plain_report: dict[str, Any]
) -> None:
    other = dict(plain_report, harness={**plain_report["harness"], "version": "0"})
    other["sweep"] = {**plain_report["sweep"], "seed": 7}
    other["cells"] = plain_report["cells"][:3]
    path = project / "other.json"
    path.write_text(json.dumps(other))
    result = run_cli("bench", "compare", str(path), str(project / "spec.json"), "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    warnings = " | ".join(payload["warnings"])
    assert "harness version differs" in warnings
    assert "prompt seed differs" in warnings
    assert "cells differs" in warnings
    assert "several engine settings" not in warnings


def test_burst_runs_are_flagged_and_the_engine_rate_reported(
    project: Path, plain_server: ProcessTarget
) -> None:
    """On a busy 2-core host the stream reaches the client in bursts (issue 14: 114-158x the
    engine's rate at c=1). No client rate may come from a burst; the engine's stands.

    A proxy delivers every second run's stream in one piece, as a starved client reads it
    (tests/support/burst_proxy.py); the others pass through as they stream."""
    out = project / "bursts.json"
    with BurstProxy(plain_server.base_url, hold=lambda n: n % 2 == 0) as proxy:
        argv = ["--url", proxy.url, "--profile", "cpu-plain", "--pp", "32", "--tg", "64",
                "--concurrency", "1", "--runs", "6", "--no-warmup", "--json-file", str(out),
                "--markdown", str(project / "bursts.md")]  # fmt: skip
        result = _bench(project, *argv)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert proxy.held == [2, 4, 6]
    (cell,) = json.loads(out.read_text())["cells"]
    engine = cell["engine"]
    assert engine["source"] == "vllm:request_time_per_output_token_seconds"
    assert engine["requests"] == 6 and engine["decode_tps_request"] > 0
    assert cell["decode_tps_engine"]["n"] == 6
    bursts = [index for index, run in enumerate(cell["runs"], start=1) if run["burst"]]
    assert set(proxy.held) <= set(bursts), [r["burst"] for r in cell["runs"]]
    assert cell["burst_runs"] == len(bursts)
    for index, run in enumerate(cell["runs"], start=1):
        assert run["decode_tps_engine"] > 0
        if run["burst"]:
            assert run["decode_tps_request"] is None and run["decode_tps_aggregate"] is None
            assert any(f.startswith(f"run {index}: burst") for f in cell["flags"])
        elif abs(run["client_engine_ratio"] - 1) > 0.05:
            assert any(f.startswith(f"run {index}: client decode rate") for f in cell["flags"])
    reported = cell["decode_tps_request"]["max"]
    assert reported is None or reported <= 1.5 * cell["decode_tps_engine"]["max"]
    assert "burst" in (project / "bursts.md").read_text()


ARENA_CPU = Path(__file__).parent / "data" / "sweeps" / "spark-arena-v2-cpu.yaml"


def _keys(report: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    return [(c["depth"], c["concurrency"], c["pp"], c["tg"]) for c in report["cells"]]


def _interrupted(project: Path, url: str, out: Path, after_cells: int) -> dict[str, Any]:
    """A spark-arena-v2-shaped sweep in its own process, stopped with SIGINT once its
    --json-file holds ``after_cells`` cells: what it leaves there."""
    argv = [
        installed_entry_point(),
        "--project",
        str(project),
        "--quiet",
        "bench",
        "--url",
        url,
        "--profile",
        "cpu-plain",
        "--sweep",
        str(ARENA_CPU),
        "--json-file",
        str(out),
    ]
    bench = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not out.exists() or len(json.loads(out.read_text())["cells"]) < after_cells:
            assert bench.poll() is None, bench.communicate()
            assert time.monotonic() < deadline, "the sweep made no progress"
            time.sleep(0.05)  # each read parses whole: the file is replaced, never rewritten
        bench.send_signal(signal.SIGINT)
        stdout, stderr = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode != 0, stdout + stderr
    kept: dict[str, Any] = json.loads(out.read_text())
    return kept


def test_an_interrupted_spark_arena_sweep_resumes_to_the_same_28_cells(
    project: Path, plain_server: ProcessTarget
) -> None:
    """An uninterrupted sweep's cells are its schedule's, in order (test_bench_arena); the
    resumed one must end with exactly those, the finished ones carried as measured and the
    rest measured with the prompts the whole sweep would have sent (exact lengths). A whole
    reference sweep here would cost three more minutes of CI."""
    schedule = [tuple(pair) for pair in yaml.safe_load(ARENA_CPU.read_text())["schedule"]]
    part = project / "arena-part.json"
    kept = _interrupted(project, plain_server.base_url, part, 10)
    assert kept["complete"] is False and kept["error"].startswith("interrupted")
    assert 10 <= len(kept["cells"]) < 28 == len(schedule)
    assert len(kept["cells"]) + len(kept["pending_cells"]) == 28
    assert [k[:2] for k in _keys(kept)] == schedule[: len(kept["cells"])]

    resumed_file = project / "arena-resumed.json"
    again = _bench(project, "--url", plain_server.base_url, "--profile", "cpu-plain",
                   "--resume", str(part), "--json-file", str(resumed_file))  # fmt: skip
    assert again.exit_code == 0, again.output
    resumed = json.loads(resumed_file.read_text())
    assert resumed["complete"] is True and resumed["pending_cells"] == []
    assert _keys(resumed) == [(d, c, 32, 8) for d, c in schedule]  # the same 28, in order
    carried = {(c["depth"], c["concurrency"]): c for c in kept["cells"]}
    assert resumed["resumed_from"]["cells"] == [
        f"pp=32 tg=8 depth={d} c={c}" for d, c in carried
    ]  # fmt: skip
    for cell in resumed["cells"]:
        key = (cell["depth"], cell["concurrency"])
        if key in carried:
            assert cell == carried[key]  # as measured then, not again
            continue
        assert cell["errors"] == 0 and cell["requests"] == cell["concurrency"]
        assert cell["prompt_tokens"] == cell["prompt_tokens_target"] == key[0] + 32
        assert cell["completion_tokens"] == 8
        if key[0] >= 128:  # whole cache blocks (vLLM CPU: 128 tokens) of context were hit
            assert cell["prefix_cache_hit_tokens"] >= 128 * cell["concurrency"]
    assert resumed["prompts"]["exact"] is True


def test_a_resume_against_another_engine_is_refused_before_the_sweep(project: Path) -> None:
    part = project / "arena-part.json"
    if not part.exists():
        pytest.skip("needs the interrupted sweep of the test before")
    other = _bench(project, "--url", "http://127.0.0.1:9", "--profile", "cpu-spec",
                   "--resume", str(part))  # fmt: skip
    assert other.exit_code == 2, other.output
    assert "this run's engine differs from that sweep's (profile: cpu-plain then, " in (
        other.stderr
    )
    assert "serve flags: method (unset) → ngram; num_speculative_tokens (unset) → 3" in other.stderr
    typed = _bench(project, "--url", "http://127.0.0.1:9", "--profile", "cpu-plain",
                   "--resume", str(part), "--pp", "64")  # fmt: skip
    assert typed.exit_code == 2 and "--pp would be ignored" in typed.stderr


def _stopped_after(report: dict[str, Any], cells: int) -> dict[str, Any]:
    """What the checkpoint of ``report``'s sweep held after its first ``cells`` cells: the
    same fields, the rest pending (a sweep interrupted for real is the arena test's; another
    uninterrupted reference sweep beside it would cost minutes)."""
    done = report["cells"][:cells]
    (span,) = report["processes"]
    labels = [f"pp={c['pp']} tg={c['tg']} depth={c['depth']} c={c['concurrency']}" for c in done]
    rest = [f"pp={c['pp']} tg={c['tg']} depth={c['depth']} c={c['concurrency']}"
            for c in report["cells"][cells:]]  # fmt: skip
    return {**report, "cells": done, "complete": False, "error": UNFINISHED,
            "pending_cells": rest, "processes": [{**span, "cells": labels}]}  # fmt: skip


def test_a_resumed_sweep_reports_as_one_uninterrupted_sweep(
    project: Path, plain_server: ProcessTarget, plain_report: dict[str, Any]
) -> None:
    """Issue 42: a resumed report's prompt fingerprint is the uninterrupted sweep's (it
    hashed only the prompts its own process sent, and `bench compare` warned "prompts
    differs"); its time is both processes' with each span kept; carried cells are shown as
    carried (not "cell 1/4" as if measured); and `--record` marks them (issue 46)."""
    part = project / "plain-part.json"
    part.write_text(json.dumps(_stopped_after(plain_report, 2)), encoding="utf-8")
    resumed_file = project / "plain-resumed.json"
    again = run_cli("--project", str(project), "bench", "--url", plain_server.base_url,
                    "--profile", "cpu-plain", "--resume", str(part), "--json-file",
                    str(resumed_file), "--record", "cpu")  # fmt: skip
    assert again.exit_code == 0, again.output
    resumed = json.loads(resumed_file.read_text())
    assert resumed["prompts"]["fingerprint"] == plain_report["prompts"]["fingerprint"]
    assert resumed["cells"][:2] == plain_report["cells"][:2]  # carried as measured
    assert [c["prompts_sha256"] for c in resumed["cells"]] == [
        c["prompts_sha256"] for c in plain_report["cells"]
    ]  # the cells measured now sent the prompts the uninterrupted sweep sent
    compared = run_cli("bench", "compare", str(project / "plain.json"), str(resumed_file))
    assert compared.exit_code == 0, compared.output
    assert "prompts" not in compared.stderr
    earlier, now = resumed["processes"]
    assert earlier == _stopped_after(plain_report, 2)["processes"][0]
    assert now["cells"] == ["pp=64 tg=16 depth=0 c=1", "pp=64 tg=16 depth=0 c=2"]
    assert resumed["seconds"] == round(earlier["seconds"] + now["seconds"], 2)
    assert "cell 1/4: pp=32 tg=16 depth=0 c=1: carried, as the run resumed measured it" in (
        again.stderr
    )
    assert "cell 3/4: pp=64 tg=16 depth=0 c=1\n" in again.stderr  # measured, not carried
    record = lockfile.load(project / "images.lock").builds["cpu"].bench
    assert record is not None
    assert [c.carried for c in record[IMAGE_ID]["cpu-plain"].cells] == [True, True, None, None]


def _other_model(part: dict[str, Any]) -> None:
    part["engine"] = {**part["engine"], "served_model": "someone/else"}


def _other_prompts(part: dict[str, Any]) -> None:
    part["cells"][0] = {**part["cells"][0], "prompts_sha256": "0" * 64}


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        # A URL answers with what it serves now: another model there is another engine
        # (issue 46: the served model and version were not compared).
        (_other_model, "the engine that answered is not the one that sweep measured (served "
                       "model: someone/else then, "),
        # A carried cell measured with other prompts than this run makes (another tokenizer):
        # carried, the fingerprint would claim prompts the sweep never sent.
        (_other_prompts, "the prompts this run makes for pp=32 tg=16 depth=0 c=1 differ from "
                         "the ones that sweep sent"),
    ],
    ids=["served-model", "prompts"],
)  # fmt: skip
def test_a_resume_whose_engine_answers_otherwise_is_refused(
    project: Path,
    plain_server: ProcessTarget,
    plain_report: dict[str, Any],
    edit: Any,
    said: str,
) -> None:
    part = _stopped_after(plain_report, 2)
    edit(part)
    path = project / "plain-edited.json"
    path.write_text(json.dumps(part), encoding="utf-8")
    before = path.read_text()
    out = project / "edited-out.json"
    refused = _bench(project, "--url", plain_server.base_url, "--profile", "cpu-plain",
                     "--resume", str(path), "--json-file", str(out))  # fmt: skip
    assert refused.exit_code == 2, refused.output
    assert said in refused.stderr
    assert path.read_text() == before


def test_engine_dying_mid_sweep_keeps_finished_cells(
    project: Path, plain_server: ProcessTarget, plain_report: dict[str, Any]
) -> None:
    """Runs last: it kills the shared plain server."""
    out = project / "dies.json"
    metrics = plain_server.base_url + "/metrics"

    def finished_requests() -> float:
        text = requests.get(metrics, timeout=5).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm:request_success_total")
        )

    started_with = finished_requests()
    # Its own process: the test kills the engine while this sweep is running.
    argv = [installed_entry_point(), "--project", str(project), "--quiet", "bench"]
    argv += ["--url", plain_server.base_url, "--profile", "cpu-plain", "--json-file", str(out)]
    argv += ["--pp", "32", "--tg", "64", "--concurrency", "1,2,4,8", "--runs", "2"]
    bench = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Warm-up plus the first cell (2 runs x 1 request) = 3 finished requests.
        deadline = time.monotonic() + 300
        while finished_requests() < started_with + 3:
            assert bench.poll() is None, bench.communicate()
            assert time.monotonic() < deadline, "the sweep made no progress"
            time.sleep(0.05)
        assert plain_server.pid is not None
        os.killpg(plain_server.pid, signal.SIGKILL)
        stdout, stderr = bench.communicate(timeout=300)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 1, stdout + stderr
    assert "engine stopped answering" in stderr
    assert "cells not measured" in stderr
    report = json.loads(out.read_text())
    assert report["complete"] is False
    assert "stopped answering" in report["error"]
    assert len(report["cells"]) >= 1
    assert report["cells"][0]["concurrency"] == 1 and report["cells"][0]["errors"] == 0
    done = len(report["cells"]) + len(report["pending_cells"])
    assert done == 4
