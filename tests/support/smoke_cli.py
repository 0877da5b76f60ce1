"""Helpers for smoke-stage tests: a scratch project, the CLI in a process of its own, leftover
processes."""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sparkbuild.engines.profiles import DEEP_FIELDS
from tests.support.cli import run_cli

__all__ = [
    "PROCESS_TREE",
    "REPO",
    "SmokeRun",
    "available_gib",
    "processes_with_token",
    "run_smoke_cli",
    "run_under_a_floor",
    "write_profile",
]

REPO = Path(__file__).resolve().parents[2]
CPU_REFERENCE = REPO / "smoke" / "cpu-reference.yaml"
# The reference runs vLLM's engine core inside the API server's process; a test of what
# survives a kill or a timeout wants vLLM's own process tree (server, engine core, worker).
PROCESS_TREE = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}


@dataclass
class SmokeRun:
    returncode: int
    stdout: str
    stderr: str
    result: dict[str, Any] | None

    def check(self, name: str) -> dict[str, Any]:
        assert self.result is not None, (
            f"no JSON result\nstdout:{self.stdout}\nstderr:{self.stderr}"
        )
        return next(c for c in self.result["checks"] if c["name"] == name)

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def explain(self) -> str:
        shown = json.dumps(self.result, indent=1)[:4000] if self.result else self.stdout[-3000:]
        return f"rc={self.returncode}\n{shown}\nstderr:\n{self.stderr[-2000:]}"


def write_profile(project: Path, name: str, **changes: Any) -> tuple[Path, str]:
    """Copy the CPU reference profile into ``project/smoke/<name>.yaml`` with top-level or
    ``expect``/``container``/``env`` changes, plus a unique env token to find its processes
    by. Returns (path, token). The CPU reference's deep checks are left out (a test of the
    plain checks runs those alone); a test of a deep check declares it in ``expect``."""
    data = without_deep_checks(yaml.safe_load(CPU_REFERENCE.read_text(encoding="utf-8")))
    token = uuid.uuid4().hex
    for key, value in changes.items():
        if key in ("expect", "container", "env") and isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    data.setdefault("env", {})["SPARKBUILD_SMOKE_TEST_TOKEN"] = token
    path = project / "smoke" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path, token


def without_deep_checks(profile: dict[str, Any]) -> dict[str, Any]:
    """``profile`` with no deep check declared in its ``expect`` (docs/smoke.md)."""
    expect = profile.get("expect") or {}
    profile["expect"] = {k: v for k, v in expect.items() if k not in DEEP_FIELDS.values()}
    return profile


def run_smoke_cli(
    project: Path, *args: str, timeout: float = 600, env: dict[str, str] | None = None
) -> SmokeRun:
    """``sparkbuild --project PROJECT smoke ARGS --json-file FILE`` in a subprocess (no file
    when ARGS send the JSON to stdout with ``--json``); ``env`` adds to its environment."""
    out = project / f"result-{uuid.uuid4().hex[:8]}.json"
    json_out = () if "--json" in args else ("--json-file", str(out))
    # Its own process: the engine it starts is its child, and must die with it.
    done = run_cli(
        "--project", str(project), "smoke", *args, *json_out, process=True, timeout=timeout,
        env=env,
    )  # fmt: skip
    result = json.loads(out.read_text(encoding="utf-8")) if out.exists() else None
    return SmokeRun(done.exit_code, done.stdout, done.stderr, result)


def processes_with_token(token: str) -> list[int]:
    """Pids whose environment carries ``token`` (every process an engine spawned inherits it)."""
    needle = f"SPARKBUILD_SMOKE_TEST_TOKEN={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def available_gib() -> float:
    """This host's MemAvailable now, in GiB."""
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    return int(next(x for x in meminfo if x.startswith("MemAvailable:")).split()[1]) / (1 << 20)


def run_under_a_floor(project: Path, *args: str, tries: int = 3) -> tuple[float, SmokeRun]:
    """``smoke ARGS`` with the memory floor 0.3 GiB under what is free as it starts (an
    engine's imports take more). MemAvailable is the host's: when other work frees more than
    the engine takes meanwhile, nothing falls under the floor; such a run must say so (its
    lowest stayed above on every node), and the run is tried again with the floor under what
    is free then. Returns (the floor, the run the guard stopped)."""
    for _ in range(tries):
        floor = available_gib() - 0.3
        run = run_smoke_cli(project, *args, "--memory-floor", f"{floor:.3f}")
        assert run.result is not None, run.explain()
        memory = run.result["host"]["memory"]
        if memory["stopped"] is not None:
            return floor, run
        for node in memory["nodes"]:  # not stopped: nothing fell under, or the guard missed
            assert node["lowest_available_gib"] >= node["floor_gib"], run.explain()
    raise AssertionError(f"other work freed more memory than the engine took, {tries} times")
