"""`bench compare` says what its percentages were measured on: each run records its host (CPU
model, cores, memory, load average at start and end), compare shows both hosts side by side
and warns, before any percentage, when the hosts or their load differ; a percentage over a
baseline that shows as zero is "n/a (baseline ~0)"; settings differ as readable diffs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sparkbuild.bench import host as bench_host
from sparkbuild.bench.report import delta_percent, near_zero
from tests.support.cli import RunCli
from tests.test_bench_figures import _report

ROOT = Path(__file__).resolve().parents[1]
SPARK_HOST = {
    "hostname": "spark-1", "platform": "Linux", "machine": "aarch64", "cpus": 20,
    "python": "3.12", "cpu_model": "Cortex-X925", "memory_gib": 119.7,
    "load_start": [0.1, 0.2, 0.2], "load_end": [1.2, 0.5, 0.3],
}  # fmt: skip
BUSY_HOST = {
    "hostname": "vm", "platform": "Linux", "machine": "x86_64", "cpus": 2, "python": "3.11",
    "cpu_model": "Intel Xeon", "memory_gib": 23.4,
    "load_start": [9.0, 8.0, 7.0], "load_end": [11.0, 9.0, 8.0],
}  # fmt: skip


def _variant(path: Path, name: str, **changes: Any) -> Path:
    data = json.loads(path.read_text())
    for key, value in changes.items():
        data[key] = value
    out = path.with_name(name)
    out.write_text(json.dumps(data))
    return out


def test_a_run_records_its_host_and_load() -> None:
    info = bench_host.host_info(load_start=[1.0, 2.0, 3.0])
    assert info.cpus and info.cpus >= 1
    assert info.cpu_model  # this machine's /proc/cpuinfo names it
    assert info.memory_gib is not None and info.memory_gib > 0
    assert info.load_start == [1.0, 2.0, 3.0]
    assert info.load_end is not None and len(info.load_end) == 3


def test_compare_shows_both_hosts_and_warns_before_any_percentage(
    run_cli: RunCli, tmp_path: Path
) -> None:
    base = _report(tmp_path)
    a = _variant(base, "a.json", host=SPARK_HOST)
    b = _variant(base, "b.json", host=BUSY_HOST)

    result = run_cli("bench", "compare", str(a), str(b))

    assert result.exit_code == 0, result.output
    warned = " ".join(result.stderr.split())
    assert "the runs come from different hosts: A spark-1, Cortex-X925, 20 cpus, 119.7 GiB;" in (
        warned
    )
    assert "B vm, Intel Xeon, 2 cpus, 23.4 GiB" in warned
    assert "the hosts' load differs: A 0.06, B 5.5 per core" in warned
    out = result.stdout
    hosts_at, first_percent = out.index("hosts"), out.index("%")
    assert hosts_at < first_percent  # the hosts come before any percentage
    for fact in ("Cortex-X925", "Intel Xeon", "119.7 GiB", "9 / 8 / 7", "0.1 / 0.2 / 0.2"):
        assert fact in out, fact


def test_the_same_host_under_the_same_load_gives_no_host_warning(
    run_cli: RunCli, tmp_path: Path
) -> None:
    base = _variant(_report(tmp_path), "a.json", host=BUSY_HOST)
    result = run_cli("bench", "compare", str(base), str(base))
    assert result.exit_code == 0, result.output
    assert "different hosts" not in result.stderr and "load differs" not in result.stderr


def test_an_old_report_without_load_says_its_load_is_unknown(
    run_cli: RunCli, tmp_path: Path
) -> None:
    base = _report(tmp_path)  # a host as reports recorded it before: no load, no CPU model
    result = run_cli("bench", "compare", str(base), str(_variant(base, "b.json", host=BUSY_HOST)))
    assert result.exit_code == 0, result.output
    assert "A does not record its host's load average" in " ".join(result.stderr.split())


def test_a_percentage_over_a_baseline_shown_as_zero_is_not_given(
    run_cli: RunCli, tmp_path: Path
) -> None:
    """A median ITL of 0 under speculative bursts gave "+111036.4 %"."""
    assert near_zero(0.0004, 2) and not near_zero(0.01, 2)
    assert delta_percent(0.0004, 0.45, 2) is None
    assert delta_percent(0.45, 0.9, 2) == 100.0
    base = json.loads(_report(tmp_path).read_text())
    for cell in base["cells"]:
        cell["itl_p50_s"] = 0.0000004  # 0.0004 ms: "0.00"
    a = tmp_path / "zero.json"
    a.write_text(json.dumps(base))
    for cell in base["cells"]:
        cell["itl_p50_s"] = 0.00045
    b = tmp_path / "some.json"
    b.write_text(json.dumps(base))

    shown = run_cli("bench", "compare", str(a), str(b), "--markdown", str(tmp_path / "c.md"))
    as_json = run_cli("bench", "compare", str(a), str(b), "--json")

    assert shown.exit_code == 0, shown.output
    assert "0.00 → 0.45 (n/a (baseline ~0))" in (tmp_path / "c.md").read_text()
    itl = json.loads(as_json.stdout)["cells"][0]["ITL p50 ms"]
    assert itl["delta_pct"] is None and itl["baseline_near_zero"] is True


def test_environment_differences_are_a_diff_not_a_repr(run_cli: RunCli, tmp_path: Path) -> None:
    base = _report(tmp_path)
    engine = json.loads(base.read_text())["engine"]
    a = _variant(base, "a.json", engine={**engine, "env": {"VLLM_X": "1", "KEEP": "2"}})
    b = _variant(base, "b.json", engine={**engine, "env": {"KEEP": "2", "VLLM_Y": "3"}})

    result = run_cli("bench", "compare", str(a), str(b))

    assert result.exit_code == 0, result.output
    assert "engine environment: VLLM_X 1 → (unset); VLLM_Y (unset) → 3" in result.stderr
    assert "{'" not in result.output and '{"' not in result.stderr
