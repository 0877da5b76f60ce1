"""A smoke verdict in images.lock (``builds.<build>.smoke.<image_id>.<profile>``), made from
the stage's own result: what ran, where, and how the verdict was obtained."""

from __future__ import annotations

from pathlib import Path

from sparkbuild import jsontext, lockfile
from sparkbuild.engines.host_record import host_record
from sparkbuild.engines.profiles import Parallel
from sparkbuild.redact import redact
from sparkbuild.smoke.runner import SmokeResult


def topology(parallel: Parallel) -> lockfile.Topology:
    """How a run was spread (a profile's ``parallel:``), as the lock keeps it."""
    return lockfile.Topology(nodes=parallel.nodes, tp=parallel.tp, ep=parallel.ep, pp=parallel.pp)


def smoke_record(result: SmokeResult) -> lockfile.SmokeRecord:
    """The verdict; a cluster run adds its topology, launcher and every node's image id; each
    check's numbers and what came back (the evidence), and the deep checks declared."""
    record = lockfile.SmokeRecord(
        verdict=result.verdict,
        checks={check.name: check.status for check in result.checks},
        accept_len=result.accept_len,
        boot_seconds=result.boot_seconds,
        engine=result.engine,
        engine_version=result.engine_version,
        served_version=result.served_version,
        nan_signal=result.nan_signal,
        target=redact(f"{result.target_kind}:{result.target}"),
        verified=result.verified,
        image_id=result.image_id if result.verified else None,
        numbers={c.name: jsontext.finite(c.value) for c in result.checks if c.value is not None},
        evidence=[lockfile.EvidenceRecord(**e.to_json()) for e in result.evidence],
    )
    if result.declared:
        record.declared = list(result.declared)
    if result.compile is not None:
        record.compile = compile_record(result)
    if result.host is not None:
        record.hosts = host_record(result.host.to_json())
    if result.cluster is not None:
        run = result.cluster
        record.cluster = run.name
        record.topology = topology(run.topology)
        record.launcher = run.launcher
        record.nodes = [
            lockfile.NodeRecord(
                name=n.node, endpoint=n.endpoint, rank=n.rank, image_id=n.ran_image_id
            )
            for n in run.nodes
        ]
    return record


def compile_record(result: SmokeResult) -> lockfile.CompileRecord:
    phase = result.compile
    assert phase is not None
    boot = lockfile.CompileBoot(
        seconds=phase.seconds,
        files_added=phase.files_added,
        bytes_added=phase.bytes_added,
        compiled=phase.grew(),
        boot_seconds=result.boot_seconds,
    )
    if phase.first_boot:
        return lockfile.CompileRecord(cache=phase.key, first_boot=boot, latest=boot)
    return lockfile.CompileRecord(cache=phase.key, latest=boot)


def with_first_boot(
    lock_path: Path, build: str, made: lockfile.SmokeRecord
) -> lockfile.SmokeRecord:
    """``made`` keeping the first boot's compiling from the lock's earlier record of the
    same image and profile, when this run's boot was a later one of the same cache."""
    compiled = made.compile
    if compiled is None or compiled.first_boot is not None or not lock_path.exists():
        return made
    entry = lockfile.LockHandle.open(lock_path).entry(build)
    for records in ((entry.smoke if entry is not None else None) or {}).values():
        for earlier in records.values():
            kept = earlier.compile
            if kept is not None and kept.first_boot is not None and kept.cache == compiled.cache:
                first = kept.first_boot
                return made.model_copy(
                    update={"compile": compiled.model_copy(update={"first_boot": first})}
                )
    return made


def record(lock_path: Path, build: str, result: SmokeResult) -> str:
    """Write the verdict under ``smoke.<image_id>.<profile>``; other images' entries stay.

    An image run must have run the pinned image (else an error, nothing written); command
    and URL runs are recorded under the pinned id with ``verified: false``, which publish
    does not count.
    """
    tested_id = result.image_id if result.target_kind in ("image", "cluster") else None
    made = with_first_boot(lock_path, build, smoke_record(result))
    if result.cluster is not None and result.cluster.launcher == "lws" and result.image_id:
        tested_id = lockfile.digest_image_id(lock_path, build, result.image_id)
        made = by_image_id(made, result.image_id, tested_id)
    return lockfile.record_for_image(
        lock_path, build, result.profile, made, tested_id=tested_id, activity="smoke run"
    )


def by_image_id(made: lockfile.SmokeRecord, digest: str, image_id: str) -> lockfile.SmokeRecord:
    """A Kubernetes run's record (its pods ran ``digest``, checked at both ends of the run)
    under the image id the lock pins for that digest; a pod that ran another keeps its own."""
    nodes = lockfile.nodes_as(made.nodes, digest, image_id)
    ran = image_id if made.image_id == digest else made.image_id
    return made.model_copy(update={"image_id": ran, "nodes": nodes})
