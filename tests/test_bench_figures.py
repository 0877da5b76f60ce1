"""Bench figures that mean what they say: bursts, engine timing, llama-benchy formats.

The llama-benchy files are written by llama-benchy 0.4.0 itself (installed from PyPI into the
shared test cache, tests/support/llama_benchy.py), so the format tests read the real format.
The burst tests feed the figures code streams with known chunk arrival times; the same code
against the real engine on a loaded host is in tests/test_bench_sweep.py.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from sparkbuild.bench import llama_benchy
from sparkbuild.bench.client import StreamResult
from sparkbuild.bench.engine_timing import (
    EngineDelta,
    Histogram,
    TimingSnapshot,
    engine_delta,
    parse_histograms,
)
from sparkbuild.bench.report import load_report, markdown
from sparkbuild.bench.results import (
    BenchReport,
    CellResult,
    EngineInfo,
    HarnessInfo,
    HostInfo,
    TargetInfo,
    cell_stats,
    client_percentiles,
    run_figures,
    run_flags,
)
from sparkbuild.bench.sweep import Sweep
from sparkbuild.errors import UsageError
from tests.support.cli import run_cli
from tests.support.llama_benchy import write_outputs

PP, TG = 32, 16


def _stream(start: float, ttft: float, gap: float, tokens: int = TG) -> StreamResult:
    """A stream whose chunks (one token each) arrive ``gap`` seconds apart."""
    times = tuple(start + ttft + i * gap for i in range(tokens))
    return StreamResult(
        sent=start, first_token=times[0], last_token=times[-1], done=times[-1] + 0.001,
        prompt_tokens=PP, completion_tokens=tokens, finish_reason="length",
        chunk_times=times, chunk_tokens=tuple(range(1, tokens + 1)),
    )  # fmt: skip


def _engine(tpot_s: float, requests: int = 1) -> EngineDelta:
    itl = Histogram(((0.01, requests * (TG - 1.0)), (float("inf"), requests * (TG - 1.0))),
                    tpot_s * requests * (TG - 1), requests * (TG - 1.0))  # fmt: skip
    return EngineDelta("vllm:request_time_per_output_token_seconds", requests, tpot_s, itl, None)


def test_a_stream_received_in_one_flush_is_a_burst_and_reports_no_client_rate() -> None:
    # The engine decoded at 100 tok/s; the client got all 16 chunks within 30 microseconds.
    flushed = _stream(0.0, 0.2, 0.000002)
    figures = run_figures([flushed], engine=_engine(0.010))
    assert figures.burst is not None and "in a flush" in figures.burst
    assert figures.decode_tps_request is None and figures.decode_tps_aggregate is None
    assert figures.decode_tps_engine == pytest.approx(100.0)
    assert run_flags([figures]) == [
        f"run 1: burst ({figures.burst}); client decode rate not reported"
    ]


def test_tokens_far_faster_than_the_engine_decoded_are_a_burst() -> None:
    # 1 ms gaps, but the engine measured 98 ms per token: 98x, as in issue 14.
    figures = run_figures([_stream(0.0, 0.1, 0.001)], engine=_engine(0.098))
    assert figures.burst is not None and "in a flush" in figures.burst
    assert figures.decode_tps_request is None
    # 60 ms gaps are no flush (over half the engine's 98 ms), but still 1.6x its rate.
    figures = run_figures([_stream(0.0, 0.1, 0.060)], engine=_engine(0.098))
    assert figures.burst is not None and "1.6x faster" in figures.burst
    assert figures.decode_tps_request is None and figures.decode_tps_engine is not None


def test_agreeing_streams_report_both_rates_and_small_deviations_are_flagged() -> None:
    agree = run_figures([_stream(0.0, 0.05, 0.010)], engine=_engine(0.0101))
    assert agree.burst is None
    assert agree.decode_tps_request == pytest.approx(100.0)
    assert agree.decode_tps_engine == pytest.approx(99.0099, rel=1e-4)
    assert agree.client_engine_ratio == pytest.approx(1.01)
    assert run_flags([agree]) == []
    off = run_figures([_stream(0.0, 0.05, 0.010)], engine=_engine(0.012))
    assert off.burst is None and off.decode_tps_request == pytest.approx(100.0)
    assert run_flags([off]) == ["run 1: client decode rate +20.0 % from the engine's"]


def test_without_engine_timing_only_a_flush_is_detected() -> None:
    assert run_figures([_stream(0.0, 0.05, 0.010)]).burst is None
    assert run_figures([_stream(0.0, 0.05, 0.000002)]).burst is not None


def test_percentiles_pool_requests_and_skip_burst_runs_for_itl() -> None:
    steady = [_stream(float(i), 0.01 * (i + 1), 0.010) for i in range(100)]
    burst = [_stream(500.0, 9.0, 0.000002)]
    runs = [steady, burst]
    figures = [run_figures(steady), run_figures(burst)]
    assert figures[1].burst is not None
    got = client_percentiles(runs, figures)
    # 101 TTFTs (0.01 .. 1.00 and the burst's 9.0): nearest rank 51 and 100.
    assert got["ttft_p50_s"] == pytest.approx(0.51)
    assert got["ttft_p99_s"] == pytest.approx(1.00)
    assert got["itl_p50_s"] == pytest.approx(0.010) and got["itl_p99_s"] == pytest.approx(0.010)


VLLM_METRICS = """\
# HELP vllm:request_time_per_output_token_seconds Histogram of time_per_output_token_seconds.
# TYPE vllm:request_time_per_output_token_seconds histogram
vllm:request_time_per_output_token_seconds_bucket{engine="0",le="0.01",model_name="m"} {a}
vllm:request_time_per_output_token_seconds_bucket{engine="0",le="0.025",model_name="m"} {b}
vllm:request_time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} {b}
vllm:request_time_per_output_token_seconds_count{engine="0",model_name="m"} {b}
vllm:request_time_per_output_token_seconds_sum{engine="0",model_name="m"} {s}
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} {a}
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m"} {b}
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} {b}
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} {b}
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} {s}
"""


def _metrics(a: int, b: int, s: float) -> TimingSnapshot:
    text = VLLM_METRICS.replace("{a}", str(a)).replace("{b}", str(b)).replace("{s}", str(s))
    return TimingSnapshot(parse_histograms(text, "vllm:"))


def test_engine_timing_is_the_histogram_delta_of_the_interval() -> None:
    before, after = _metrics(10, 10, 0.05), _metrics(10, 14, 0.13)  # 4 new requests, 20 ms
    delta = engine_delta(before, after, "vllm:")
    assert delta is not None and delta.requests == 4
    assert delta.tpot_s == pytest.approx(0.02) and delta.decode_tps_request == pytest.approx(50)
    assert delta.ttft is not None and delta.ttft.bound(0.5) == 0.5  # all 4 in the 0.5 bucket
    assert engine_delta(before, before, "vllm:") is None  # no request finished
    assert engine_delta(before, TimingSnapshot({}, available=False), "vllm:") is None


# --- llama-benchy ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def benchy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_outputs(tmp_path_factory.mktemp("llama-benchy"))


def _report(tmp_path: Path, depth: int = 0) -> Path:
    """A sparkbuild report over the cells llama-benchy wrote (pp32 tg16, c1 and c2)."""
    cells = []
    for concurrency in (1, 2):
        figures = [
            run_figures([_stream(0.0, 0.04, 0.008) for _ in range(concurrency)],
                        engine=_engine(0.008, concurrency))
            for _ in range(2)
        ]  # fmt: skip
        stats = cell_stats(figures)
        cells.append(CellResult(
            pp=PP, tg=TG, depth=depth, concurrency=concurrency, ttft_s=stats["ttft_s"],
            prefill_tps=stats["prefill_tps"], decode_tps_request=stats["decode_tps_request"],
            decode_tps_aggregate=stats["decode_tps_aggregate"], output_tps=stats["output_tps"],
            prefill_tps_aggregate=stats["prefill_tps_aggregate"],
            decode_tps_engine=stats["decode_tps_engine"], accept_len=None,
            prompt_tokens_target=PP, prompt_tokens=PP, completion_tokens=TG,
            requests=2 * concurrency, errors=0, runs=figures,
        ))  # fmt: skip
    report = BenchReport(
        created="2026-11-22T01:00:00+0000", label="sparkbuild run", profile="cpu",
        harness=HarnessInfo(version="2", sparkbuild="0", http_client="httpx"),
        host=HostInfo(hostname="h", platform="p", machine="x86_64", cpus=2, python="3.11"),
        target=TargetInfo(kind="url", value="http://127.0.0.1:1"),
        engine=EngineInfo(name="vllm", model="tiny/llama", served_model="tiny/llama"),
        sweep=Sweep(pp=[PP], tg=[TG], depth=[depth], concurrency=[1, 2], runs=2),
        complete=True, cells=cells,
    )  # fmt: skip
    path = tmp_path / "sparkbuild.json"
    path.write_text(report.model_dump_json(), encoding="utf-8")
    return path


def _compare(*args: str) -> Any:
    return run_cli("bench", "compare", *args)


@pytest.mark.upstream
@pytest.mark.parametrize("benchy_side", ["a", "b"])
def test_compare_takes_a_llama_benchy_json_on_either_side(
    benchy: dict[str, Path], tmp_path: Path, benchy_side: str
) -> None:
    ours = _report(tmp_path)
    a, b = (benchy["json"], ours) if benchy_side == "a" else (ours, benchy["json"])
    out = tmp_path / "compare.json"
    result = _compare(str(a), str(b), "--json-file", str(out))
    assert result.exit_code == 0, result.output
    compared = json.loads(out.read_text())
    assert [(r["pp"], r["tg"], r["depth"], r["concurrency"]) for r in compared["cells"]] == [
        (PP, TG, 0, 1), (PP, TG, 0, 2),
    ]  # fmt: skip
    theirs = "a" if benchy_side == "a" else "b"
    mine = "b" if benchy_side == "a" else "a"
    c1, c2 = compared["cells"]
    # llama-benchy's tg rate per request: runs at 10 and 12 ms per token, mean 91.67 tok/s.
    assert c1["decode tok/s/req"][theirs] == pytest.approx(91.6667, abs=1e-3)
    assert c2["decode tok/s total"][theirs] == pytest.approx(183.3333, abs=1e-3)
    assert c1["TTFT s"][theirs] == pytest.approx(0.05, abs=1e-6)  # its 50 ms
    assert c1["decode tok/s/req"][mine] == pytest.approx(125.0)
    assert any("llama-benchy 0.4.0 report" in w for w in compared["warnings"])


@pytest.mark.upstream
def test_csv_export_has_llama_benchys_columns_and_test_names(
    benchy: dict[str, Path], tmp_path: Path
) -> None:
    theirs = list(csv.DictReader(io.StringIO(benchy["csv"].read_text())))
    report = load_report(_report(tmp_path))
    ours = list(csv.DictReader(io.StringIO(llama_benchy.to_csv(report))))
    their_columns = list(theirs[0])
    assert list(ours[0])[: len(their_columns)] == their_columns
    assert list(ours[0])[len(their_columns) :] == list(llama_benchy.SPARKBUILD_CSV_COLUMNS)
    depth0 = [row["test_name"] for row in theirs if "@ d" not in row["test_name"]]
    assert [row["test_name"] for row in ours] == depth0
    tg_c2 = next(row for row in ours if row["test_name"] == "tg16 (c2)")
    assert float(tg_c2["t_s_req_mean"]) == pytest.approx(125.0)
    assert float(tg_c2["engine_t_s_req_mean"]) == pytest.approx(125.0)
    assert tg_c2["burst_runs"] == "0"


@pytest.mark.upstream
def test_markdown_export_has_llama_benchys_headers(benchy: dict[str, Path], tmp_path: Path) -> None:
    def header(text: str) -> list[str]:
        return [cell.strip() for cell in text.splitlines()[0].strip("|").split("|")]

    theirs = header(benchy["md"].read_text())
    report = load_report(_report(tmp_path))
    table = llama_benchy.to_markdown(report)
    assert header(table)[: len(theirs)] == theirs
    row = next(line for line in table.splitlines() if "| tg16 (c1) |" in line)
    assert "125.00 ± 0.00" in row


@pytest.mark.upstream
def test_llama_benchy_report_loads_with_its_metadata(benchy: dict[str, Path]) -> None:
    report = load_report(benchy["json"])
    assert report.harness.name == "llama-benchy" and report.harness.version == "0.4.0"
    assert report.engine.model == "tiny/llama"
    assert {(c.depth, c.concurrency) for c in report.cells} == {(0, 1), (0, 2), (64, 1), (64, 2)}
    assert "| engine tok/s/req |" in markdown(report)


def test_a_malformed_llama_benchy_file_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"benchmarks": [{"concurrency": "many"}]}), encoding="utf-8")
    with pytest.raises(UsageError, match=r"bad\.json is not a sparkbuild bench report"):
        load_report(bad)
    result = _compare(str(bad), str(bad))
    assert result.exit_code == 2 and "bad.json" in result.output


def test_a_figure_too_large_to_be_finite_is_refused_naming_its_field(tmp_path: Path) -> None:
    """``1e999`` is valid JSON that Python reads as infinity: compare showed it as ``inf``
    (issue 46, low)."""
    ours = _report(tmp_path)
    data = json.loads(ours.read_text())
    data["cells"][1]["decode_tps_request"]["median"] = "HUGE"
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps(data).replace('"HUGE"', "1e999"), encoding="utf-8")
    result = _compare(str(ours), str(huge))
    assert result.exit_code == 2, result.output
    assert "huge.json is not a sparkbuild bench report" in result.stderr
    assert "cells[1].decode_tps_request.median is not a finite number" in result.stderr
    assert "inf" not in result.stdout


def test_tokens_handed_over_in_pairs_at_the_engines_rate_are_no_burst() -> None:
    # A frontend that passes two tokens per read: half the gaps are ~0, the rate is right.
    times = tuple(0.05 + (i // 2) * 0.002 + (i % 2) * 0.00001 for i in range(TG))
    paired = StreamResult(
        sent=0.0, first_token=times[0], last_token=times[-1], done=times[-1] + 0.001,
        prompt_tokens=PP, completion_tokens=TG, finish_reason="length",
        chunk_times=times, chunk_tokens=tuple(range(1, TG + 1)),
    )  # fmt: skip
    engine_tpot = (times[-1] - times[0]) / (TG - 1)
    figures = run_figures([paired], engine=_engine(engine_tpot))
    assert figures.burst is None and figures.client_engine_ratio == pytest.approx(1.0)
    assert figures.decode_tps_request is not None
