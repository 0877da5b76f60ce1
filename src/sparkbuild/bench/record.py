"""A benchmark run in images.lock (``builds.<build>.bench.<image_id>.<profile>``), made from
the stage's own report: enough to see a regression (the report file has the rest)."""

from __future__ import annotations

from sparkbuild import lockfile
from sparkbuild.bench.results import BenchReport, CellResult
from sparkbuild.engines.host_record import host_record
from sparkbuild.redact import redact, secret_args
from sparkbuild.smoke.record import topology


def bench_cell(cell: CellResult, *, carried: bool = False) -> lockfile.BenchCell:
    """One cell of a sweep: its shape, the medians over its runs, and whether a resumed
    sweep carried it from an earlier process."""
    return lockfile.BenchCell(
        pp=cell.pp,
        tg=cell.tg,
        depth=cell.depth,
        concurrency=cell.concurrency,
        ttft_s=cell.ttft_s.median,
        prefill_tps=cell.prefill_tps.median,
        decode_tps_request=cell.decode_tps_request.median,
        decode_tps_aggregate=cell.decode_tps_aggregate.median,
        decode_tps_engine=cell.decode_tps_engine.median,
        burst_runs=cell.burst_runs,
        accept_len=cell.accept_len,
        errors=cell.errors,
        carried=carried or None,
    )


def bench_record(report: BenchReport) -> lockfile.BenchRecord:
    carried = set(report.resumed_from.cells) if report.resumed_from else set()
    record = lockfile.BenchRecord(
        created=report.created,
        label=redact(report.label),
        harness=report.harness.version,
        seed=report.sweep.seed,
        runs=report.sweep.runs,
        engine_args=secret_args(report.engine.args),
        host=report.host.summary,
        cells=[bench_cell(c, carried=c.key.label() in carried) for c in report.cells],
    )
    if report.topology is not None:
        record.topology = topology(report.topology)
    if report.target.nodes:
        record.nodes = [
            lockfile.NodeRecord(name=n.name, endpoint=n.endpoint, rank=n.rank, image_id=n.image_id)
            for n in report.target.nodes
        ]
    hosts = host_record(report.host_facts)
    if hosts is not None:
        record.hosts = hosts
    return record
