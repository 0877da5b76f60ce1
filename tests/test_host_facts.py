"""Host facts (engines/host_facts.py): this machine's, read for real, and a DGX Spark's, read
from the real formats replayed in tests/data/hosts/gb10 (what only a GB10 has: the NVIDIA
driver, nvidia-smi, DGX OS, DMI and ConnectX firmware)."""

from __future__ import annotations

import json
import os
import platform
import shutil
from pathlib import Path

import pytest

from sparkbuild.engines import host_facts
from sparkbuild.engines.host_facts import LocalSource, parse_nvidia_version, read_node

GB10 = Path(__file__).parent / "data" / "hosts" / "gb10"


def _gb10(root: Path = GB10, *, docker: bool = True) -> host_facts.NodeFacts:
    info = json.loads((GB10 / "docker-info.json").read_text()) if docker else None
    return read_node(LocalSource(root, root / "commands"), "spark-1", info)


def test_this_machine_s_facts_are_read_for_real() -> None:
    facts = host_facts.this_host()
    assert facts.value("kernel") == platform.release()
    pretty = dict(host_facts.key_values(Path("/etc/os-release").read_text()))["PRETTY_NAME"]
    assert facts.value("os") == pretty
    assert facts.value("arch") == platform.machine()
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    total = int(next(line for line in meminfo if line.startswith("MemTotal")).split()[1])
    assert facts.memory is not None and facts.memory.total_kib == total
    assert 0 < facts.memory.available_kib <= total
    # This machine has no GPU, DMI tables or RDMA devices: each is "none", saying why.
    absent = {
        "driver": ("/proc/driver/nvidia/version", "no NVIDIA driver loaded"),
        "dgx_os": ("/etc/dgx-release", "not DGX OS"),
        "bios": ("/sys/class/dmi/id", "no DMI tables"),
        "connectx_fw": ("/sys/class/infiniband", "no RDMA devices"),
    }
    for name, (path, why) in absent.items():
        if Path(path).exists():
            continue  # a machine that has it reads it (not this project's CI)
        assert facts.value(name) == "none" and why in facts.why[name], (name, facts.why)
    if shutil.which("docker") and Path("/var/run/docker.sock").exists():
        import docker

        assert facts.value("docker") == docker.from_env().version()["Version"]
        assert facts.value("nvidia_runtime") is not None
    payload = json.loads(json.dumps(facts.to_json()))
    assert payload["node"] == "this host" and payload["read_at"].endswith("Z")
    assert payload["unknown"]["nccl"] == "read from the engine's container once it runs"


def test_a_dgx_spark_s_facts_from_its_real_formats() -> None:
    facts = _gb10()
    assert {n: facts.value(n) for n in host_facts.FACT_NAMES if n != "nccl"} == {
        "kernel": "6.17.0-1029-nvidia",
        "os": "Ubuntu 24.04.3 LTS",
        "dgx_os": "DGX Spark 7.4.0",  # the last OTA appended, not the 7.2.3 it shipped with
        "arch": "aarch64",
        "driver": "580.126.09",
        "cuda_driver": "13.0",
        "gpu": "NVIDIA GB10",
        "vbios": "none",
        "persistence": "Enabled",
        "mig": "none",
        "bios": "5.36_0ACUM018",
        "connectx_fw": "28.45.4028",  # four functions of one ConnectX-7 agree
        "docker": "29.2.1",
        "nvidia_runtime": "installed, not the default (runc is)",
    }
    assert "[N/A]" in facts.why["mig"]
    assert facts.memory is not None and round(facts.memory.total_gib, 1) == 121.7
    assert round(facts.memory.available_gib, 1) == 24.3 and facts.memory.swap_used_gib == 0
    assert "0000000000000" not in json.dumps(facts.to_json())  # the serial is never read


def test_a_node_without_nvidia_smi_or_with_firmware_that_differs(tmp_path: Path) -> None:
    root = tmp_path / "spark"
    shutil.copytree(GB10, root)
    (root / "commands" / "nvidia-smi-query.txt").unlink()
    (root / "sys" / "class" / "infiniband" / "roceP2p1s0f1" / "fw_ver").write_text("28.44.1036\n")
    facts = _gb10(root)
    assert facts.value("driver") == "580.126.09"  # the module's file still says it
    assert facts.value("gpu") is None
    assert facts.unknown()["gpu"] == "nvidia-smi is not installed"
    assert facts.value("connectx_fw") == (
        "roceP2p1s0f0 28.45.4028, roceP2p1s0f1 28.44.1036, rocep1s0f0 28.45.4028, "
        "rocep1s0f1 28.45.4028"
    )


def test_hostile_or_broken_fact_files_are_unknown_with_why(tmp_path: Path) -> None:
    root = tmp_path / "spark"
    shutil.copytree(GB10, root)
    (root / "etc" / "dgx-release").write_text("DGX_NAME=x\n" * 20000)  # over 64 KiB
    (root / "proc" / "driver" / "nvidia" / "version").write_text("NVRM: garbage\n")
    (root / "commands" / "nvidia-smi-query.txt").write_text("NVIDIA GB10, 580\n")
    os.remove(root / "etc" / "os-release")
    os.mkfifo(root / "etc" / "os-release")  # would block a plain read forever
    facts = _gb10(root, docker=False)
    unknown = facts.unknown()
    assert "larger than" in unknown["dgx_os"]
    assert unknown["driver"] == "/proc/driver/nvidia/version has no 'NVRM version' line"
    assert unknown["gpu"] == "nvidia-smi answered 'NVIDIA GB10, 580', not 5 columns"
    assert "FIFO" in unknown["os"]
    assert facts.value("kernel") == "6.17.0-1029-nvidia"  # the rest is still read
    assert unknown["docker"] == "no Docker daemon asked"
    # Where the node's own file is unreadable, the Docker daemon's view of it stands in.
    assert _gb10(root).value("os") == "Ubuntu 24.04.3 LTS"


def test_the_older_driver_banner_gpud_records() -> None:
    older = "NVRM version: NVIDIA UNIX aarch64 Kernel Module  550.120  Fri Sep 13 11:01:10 UTC 2024"
    assert parse_nvidia_version(older) == "550.120"
    with pytest.raises(host_facts.FactUnreadable):
        parse_nvidia_version("GCC version:  gcc version 13.3.0\n")
