"""A verdict's hosts where people read them: the report's build page, `verify`'s view of the
signed verdicts, and the verdicts attestation publish signs (attest/statements)."""

from __future__ import annotations

import platform
import re
from pathlib import Path

import yaml

from sparkbuild import lockfile
from sparkbuild.attest.statements import verdicts
from sparkbuild.engines.host_record import host_lines, verdict_hosts
from tests.support.cli import RunCli

IMAGE = "sha256:" + "a" * 64
HOSTS = {
    "read_at": "2026-11-27T12:00:00Z",
    "nodes": [{
        "node": "spark-1",
        "facts": {"kernel": "6.17.0-1029-nvidia", "driver": "580.95.05",
                  "dgx_os": "DGX Spark 7.4.0"},
        "unknown": {"bios": "no DMI tables"},
        "available_at_start_gib": 110.5, "lowest_available_gib": 9.2,
        "taken_gib": {"loading": 22.1, "kv cache": 101.3},
    }],
    "memory_floor": "max(6 GiB, 5 % of memory)",
    "drift": ["DGX OS differs between the nodes: spark-1 DGX Spark 7.4.0, spark-2 DGX Spark 7.3.1"],
    "drift_allowed": False,
    "phases": [{"phase": "starting", "started_s": 0, "seconds": 12.5},
               {"phase": "loading", "started_s": 12.5, "seconds": 60.0},
               {"phase": "serving", "started_s": 72.5}],
}  # fmt: skip
RECORD = {"verdict": "pass", "verified": True, "image_id": IMAGE, "target": "image:q",
          "hosts": HOSTS}  # fmt: skip


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_the_build_page_shows_the_hosts_and_what_differs_from_the_report_s_host(
    run_cli: RunCli, tmp_path: Path
) -> None:
    lock = {"schema": 1, "builds": {"qb": {"image": {"image_id": IMAGE},
                                           "smoke": {IMAGE: {"ref": RECORD}}}}}  # fmt: skip
    (tmp_path / "images.lock").write_text(yaml.safe_dump(lock))
    made = run_cli("--project", str(tmp_path), "report", "--out", str(tmp_path / "out"))
    assert made.exit_code == 0, made.output
    page = _text((tmp_path / "out" / "builds" / "qb.html").read_text())
    hosts = page[page.index("hosts read 2026-11-27T12:00:00Z") :]
    assert "node spark-1 kernel 6.17.0-1029-nvidia DGX OS DGX Spark 7.4.0 NVIDIA driver " in hosts
    assert "BIOS unknown: no DMI tables" in hosts
    assert "MemAvailable at the start 110.50 GiB lowest MemAvailable 9.20 GiB" in hosts
    assert "taken, kv cache 101.30 GiB" in hosts
    assert "boot phases: starting 12.5 s · loading 60.0 s · serving from 72.5 s" in hosts
    assert "drift: DGX OS differs between the nodes: spark-1 DGX Spark 7.4.0" in hosts
    # This machine is not that Spark: the page says what differs from it.
    assert f"kernel 6.17.0-1029-nvidia (here: {platform.release()})" in hosts, hosts[:600]
    # The record's hosts are drawn once, not again among the record's other fields.
    assert page.count("6.17.0-1029-nvidia (here") == 1 and " hosts {" not in page


def test_the_signed_verdicts_carry_the_hosts_and_verify_names_a_difference() -> None:
    entry = lockfile.BuildEntry.model_validate(
        {
            "smoke": {IMAGE: {"ref": RECORD}},
            "bench": {IMAGE: {"ref": {"label": "x", "hosts": HOSTS}}},
        }
    )
    predicate = verdicts("qb", entry, IMAGE, "sha256:" + "b" * 64)
    assert predicate["smoke"]["ref"]["hosts"]["nodes"][0]["facts"]["driver"] == "580.95.05"
    assert predicate["bench"]["ref"]["hosts"]["read_at"] == "2026-11-27T12:00:00Z"
    hosts, elsewhere = verdict_hosts(predicate)
    assert list(hosts) == ["ref"]
    assert host_lines(hosts) == [
        "host  ref on spark-1: NVIDIA driver 580.95.05, kernel 6.17.0-1029-nvidia, DGX OS "
        "DGX Spark 7.4.0"
    ]
    assert elsewhere and elsewhere[0].startswith(
        "the signed smoke verdict ref was obtained on spark-1 with "
    )
    assert verdict_hosts({"smoke": {"ref": {"hosts": {"nodes": "not a list"}}}}) == ({}, [])
