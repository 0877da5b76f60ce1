"""The memory guard's parts without an engine: boot phases read from real engine log lines,
the floor's forms, the guard stopping a real process group under its floor, the run's record
in the lock, the estimate held against measured runs (`profile fit`), and drift compared."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
import yaml

from sparkbuild.adapters import adapter_type
from sparkbuild.engines.boot_phases import boot_phases
from sparkbuild.engines.host_facts import NodeFacts
from sparkbuild.engines.host_record import across, between, host_record
from sparkbuild.engines.host_watch import HostRun, differences
from sparkbuild.engines.memory_floor import SPARK_DEFAULT, parse_floor
from sparkbuild.engines.memory_guard import LocalSampler, MemoryGuard
from sparkbuild.engines.targets import ProcessTarget, free_port
from sparkbuild.lockschema import HostRecord
from tests.support.cli import RunCli

ROOT = Path(__file__).resolve().parents[1]
# vLLM 0.32's own lines on the CPU (a CI run's log), each as it arrived, seconds from start.
VLLM_BOOT = [
    (9.1, "(APIServer pid=8666) INFO 11-27 20:57:45 [model.py:733] Resolved architecture: X"),
    (20.0, "(EngineCore pid=8919) INFO [cpu_model_runner.py:68] Starting to load model /m..."),
    (21.0, "(EngineCore pid=8919) INFO [default_loader.py:501] Loading weights took 0.11 seconds"),
    (22.0, "(EngineCore pid=8919) INFO [cpu_model_runner.py:75] Loading drafter model..."),
    (22.5, "(EngineCore pid=8919) INFO [cpu_worker.py:260] Explicitly set (1.0/9.46) GiB for "
           "KV cache on node 0."),
    (24.0, "(EngineCore pid=8919) INFO [core.py:402] init engine (profile, create kv cache, "
           "warmup model) took 1.94 s"),
    (24.5, "(APIServer pid=8666) INFO [entry.py:140] Starting vLLM server on http://127.0.0.1:45911"),
    (40.0, "(APIServer pid=8666) INFO [loggers.py:335] Engine 000: ... CPU KV cache usage: 0.1%"),
]  # fmt: skip
# SGLang's ModelRunner lines (0.5.15 model_runner.py and memory_pool.py), target then draft.
SGLANG_BOOT = [
    (5.0, "[2026-11-27 TP0] Load weight begin. avail mem=110.20 GB"),
    (60.0, "[2026-11-27 TP0] Load weight end. type=Qwen3_5, avail mem=80.1 GB"),
    (61.0, "[2026-11-27 TP0] KV Cache is allocated. #tokens: 500000, KV size: 40.00 GB"),
    (70.0, "[2026-11-27 TP0] Load weight begin. avail mem=39.90 GB"),
    (72.0, "[2026-11-27 TP0] Memory pool end. avail mem=36.00 GB"),
    (75.0, "[2026-11-27 TP0] Capture target prefill CUDA graph begin. backend=x, avail mem=35 GB"),
    (90.0, "[2026-11-27] The server is fired up and ready to roll!"),
]  # fmt: skip


def _phases(engine: str, lines: list[tuple[float, str]]) -> list[tuple[str, float | None]]:
    adapter = adapter_type(engine)
    found = boot_phases(lines, adapter.boot_phases, adapter.ready_line, 0.0, ended_at=100.0)
    return [(p.name, None if p.seconds is None else round(p.seconds, 1)) for p in found]


def test_boot_phases_come_from_each_engines_own_lines() -> None:
    assert _phases("vllm", VLLM_BOOT) == [
        ("starting", 20.0), ("loading", 1.0), ("profiling", 1.0), ("loading", 0.5),
        ("kv cache", 1.5), ("starting server", 0.5), ("serving", None),
    ]  # fmt: skip
    assert _phases("sglang", SGLANG_BOOT) == [
        ("starting", 5.0), ("loading", 55.0), ("kv cache", 10.0), ("loading", 2.0),
        ("kv cache", 3.0), ("graph capture", 15.0), ("serving", None),
    ]  # fmt: skip
    # A boot that never got ready ends in the phase it was in, with its length to the end.
    stuck = _phases("sglang", SGLANG_BOOT[:2])
    assert stuck == [("starting", 5.0), ("loading", 55.0), ("kv cache", 40.0)]


@pytest.mark.parametrize(
    ("text", "gib_on_119"),
    [("8", 8.0), ("8GiB", 8.0), ("512MiB", 0.5), ("5%", 5.95), ("off", None), ("0", None)],
)
def test_the_floor_s_forms(text: str, gib_on_119: float | None) -> None:
    floor = parse_floor(text).for_total(119.0)
    assert floor == gib_on_119 or (floor is not None and abs(floor - (gib_on_119 or 0)) < 1e-9)


def test_the_spark_default_and_refused_floors() -> None:
    assert SPARK_DEFAULT.for_total(119.0) == 6.0  # 5 % of 119 is 5.95: 6 GiB is larger
    assert SPARK_DEFAULT.for_total(240.0) == 12.0
    for bad in ("nan", "-1", "5 apples", "150%", "1e400"):
        with pytest.raises(ValueError, match=r"memory floor|at most 100%"):
            parse_floor(bad)


def test_the_guard_kills_a_real_process_group_at_once(tmp_path: Path) -> None:
    # A parent and two children that take 200 MiB each: the guard's floor sits 150 MiB
    # under what was available when it started, so the first child's memory trips it.
    script = (
        "import os, time\n"
        "for _ in range(2):\n"
        "    if os.fork() == 0:\n"
        "        b = b'x' * (200 << 20); time.sleep(120)\n"
        "print('Starting to load model', flush=True)\n"
        "time.sleep(120)\n"
    )
    target = ProcessTarget([sys.executable, "-c", script], port=free_port())
    start = LocalSampler().sample()
    assert start is not None
    floor = parse_floor(f"{start.available_gib - 150 / 1024:.3f}")
    with target, MemoryGuard(target, [LocalSampler()], floor, adapter_type("vllm")()) as guard:
        deadline = time.monotonic() + 60
        while guard.stopped is None and time.monotonic() < deadline:
            time.sleep(0.05)
    stopped = guard.stopped
    assert stopped is not None, guard.report().to_json()
    assert stopped.what == f"process group {target.pid}"
    assert stopped.gone_after_s is not None and stopped.gone_after_s < 1.0
    assert stopped.available_gib < stopped.floor_gib and stopped.node == "this host"
    report = guard.report()
    check = report.check()
    assert check.name == "host-memory" and check.status == "fail"
    assert re.match(
        r"MemAvailable on this host fell to \d+\.\d\d GiB, under the floor", check.detail
    )
    (node,) = report.nodes
    assert node.samples >= 1 and node.peak_taken_gib is not None


def _facts(node: str, **facts: str) -> NodeFacts:
    return NodeFacts(node, facts, read_at="2026-11-27T00:00:00Z")


def test_drift_names_each_node_and_an_unknown_is_no_difference() -> None:
    nodes = [
        _facts("spark-1", driver="580.126.09", kernel="6.17.0-1029-nvidia", bios="5.36_0ACUM018"),
        _facts("spark-2", driver="580.126.09", kernel="6.17.0-1026-nvidia"),  # BIOS unknown
    ]
    (found,) = differences(nodes)
    assert found.refuses and found.describe() == (
        "kernel differs between the nodes: spark-1 6.17.0-1029-nvidia, spark-2 6.17.0-1026-nvidia"
    )


def test_a_verdict_on_another_driver_is_named_and_bench_compare_says_so() -> None:
    run = HostRun((_facts("spark-1", driver="580.95.05", kernel="6.17.0-1029-nvidia"),))
    record = host_record(run.to_json())
    assert record is not None and record.nodes[0].facts["driver"] == "580.95.05"
    here = _facts("this host", driver="580.126.09", kernel="6.17.0-1029-nvidia")
    assert across(record, here, "the smoke verdict b/p") == [
        "the smoke verdict b/p was obtained on spark-1 with NVIDIA driver 580.95.05 "
        "(here: 580.126.09)"
    ]
    other = host_record(HostRun((here,)).to_json())
    assert between(record, other) == [
        "the runs were obtained on another NVIDIA driver: A 580.95.05, B 580.126.09"
    ]
    assert between(record, record) == [] and across(None, here, "x") == []


def _lock_with_measured(project: Path, profile: str, taken: float, gpu: str) -> None:
    hosts = HostRecord.model_validate({
        "read_at": "2026-11-27T12:00:00Z",
        "nodes": [{"node": "spark-1", "facts": {"gpu": gpu}, "taken_gib": {"kv cache": taken,
                   "serving": taken - 1}}],
    })  # fmt: skip
    record = {"verdict": "pass", "engine_version": "0.33.0", "hosts": hosts.to_json()}
    lock = {"schema": 1, "builds": {"q": {"smoke": {"sha256:" + "a" * 64: {profile: record}}}}}
    (project / "images.lock").write_text(yaml.safe_dump(lock))


def test_profile_fit_shows_the_measured_runs_beside_the_estimate(
    run_cli: RunCli, tmp_path: Path
) -> None:
    (tmp_path / "smoke").mkdir()
    profile = "seed-qwen3.6-27b-nvfp4-mtp-vllm"
    (tmp_path / "smoke" / f"{profile}.yaml").write_text(
        (ROOT / "smoke" / f"{profile}.yaml").read_text()
    )
    _lock_with_measured(tmp_path, profile, 104.5, "NVIDIA GB10")
    shown = run_cli("--project", str(tmp_path), "profile", "fit", profile)
    # vLLM counts what it allocates beside the KV cache inside u x M: at the default 0.9 the
    # published run's launch (seed B/S2, which booted) fits, with the host's 6 GiB left.
    assert shown.exit_code == 0, shown.output
    assert "fits (peak 113.1 of 119 GiB)" in shown.stdout
    assert "took 104.50 GiB at most (kv cache); the estimate's engine takes 107.10 GiB: -2.60" in (
        shown.stdout
    )
    data = json.loads(run_cli("--project", str(tmp_path), "profile", "fit", profile, "--json",
                              "--engine-version", "0.33.0").stdout)  # fmt: skip
    (measured,) = data["measured"]
    assert measured["difference_gib"] == -2.6 and measured["on_gb10"] is True
    other = json.loads(run_cli("--project", str(tmp_path), "profile", "fit", profile, "--json",
                               "--engine-version", "0.32.0").stdout)  # fmt: skip
    assert other["measured"] == []  # of another release: not this estimate's


def test_kv_cache_memory_bytes_is_the_pool_and_the_budget(tmp_path: Path) -> None:
    from packaging.version import Version

    from sparkbuild.engines import memory_fit
    from sparkbuild.engines.profiles import SmokeProfile
    from sparkbuild.yamlfile import load_model

    profile = load_model(ROOT / "smoke" / "seed-qwen3.6-27b-nvfp4-mtp-vllm.yaml", SmokeProfile)
    sized = profile.model_copy(update={"args": [*profile.args, "--kv-cache-memory-bytes", "16G"]})
    fit = memory_fit.profile_fit(sized, version=Version("0.33.0"))
    assert not isinstance(fit, str)
    pool = next(i for i in fit.items if i.name == "KV pool")
    assert pool.gib == 16.0 and "--gpu-memory-utilization not used" in pool.formula
    assert fit.budget_gib == pytest.approx(20.5 + 0.14 + 0.32 + 16.0, abs=0.01)
    assert any("--kv-cache-memory-bytes sizes the KV pool" in n for n in fit.notes)
    too_big = profile.model_copy(
        update={"args": [*profile.args, "--kv-cache-memory-bytes", "100G"]}
    )
    refused = memory_fit.profile_fit(too_big, version=None)
    assert not isinstance(refused, str) and refused.problems[0].startswith(
        "out of memory: weights, state and the KV pool = 121.0 GiB, 0.0 GiB beside it and "
        "6 GiB for the runtime make 127.0 GiB of 119"
    )


def test_a_node_already_under_its_floor_is_refused_before_anything_starts(
    run_cli: RunCli, tmp_path: Path
) -> None:
    log, started = tmp_path / "engine.log", tmp_path / "started"
    refused = run_cli(
        "--project", str(ROOT), "smoke", "--command", f"sh -c 'touch {started}' {{port}}",
        "--profile",
        "seed-qwen3.6-27b-fp8-nextn-sglang", "--engine-version", "0.5.12",
        "--memory-floor", "99.9%", "--log", str(log),
    )  # fmt: skip
    assert refused.exit_code == 2, refused.output
    assert re.search(
        r"error: MemAvailable on this host is \d+\.\d\d GiB, under the floor of \d+\.\d\d GiB, "
        "before anything started",
        refused.stderr,
    ), refused.stderr
    assert "or lower --memory-floor" in refused.stderr
    assert not started.exists()  # the engine never started
