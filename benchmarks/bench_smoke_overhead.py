"""What `sparkbuild smoke` adds on top of the engine itself, measured in the same run.

Reference: a bare script boots the same vLLM CPU engine (the CPU reference profile's command),
polls /health every 0.1 s, sends the same requests and stops the engine with SIGTERM.
Measured: `sparkbuild smoke --command ... --profile cpu-reference`, from process start to
exit. Prints the engine's boot time, both totals and the ratios; the harness should add well
under 10 % of the engine's boot time.

    python benchmarks/bench_smoke_overhead.py [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.vllm_cpu import tiny_llama, vllm_server_command  # noqa: E402

from sparkbuild.adapters.vllm import VllmAdapter  # noqa: E402
from sparkbuild.engines.profiles import load_profile  # noqa: E402
from sparkbuild.engines.targets import free_port  # noqa: E402
from sparkbuild.net import Session  # noqa: E402
from sparkbuild.settings import Settings  # noqa: E402
from sparkbuild.smoke.runner import profile_prompts  # noqa: E402


def bare_run(launcher: str, model: str) -> tuple[float, float]:
    """(boot seconds, total seconds) of the engine driven by the simplest possible script."""
    _, profile = load_profile(Settings(project_dir=REPO), "cpu-reference", model=model)
    adapter = VllmAdapter()
    port = free_port()
    argv = [*shlex.split(launcher), *adapter.serve_args(model, "127.0.0.1", port, profile.args)]
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **profile.env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    session = Session(deadline_s=600)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if session.get(base + "/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if proc.poll() is not None:
                raise SystemExit("the reference engine exited during boot")
            time.sleep(0.1)
        boot = time.monotonic() - started
        for prompt in profile_prompts(profile):
            adapter.generate(session, base, prompt.text, profile.expect.max_tokens, profile.request)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return boot, time.monotonic() - started


def smoke_run(launcher: str, model: str) -> tuple[float, float]:
    """(boot seconds as sparkbuild measured it, time to verdict) of one `sparkbuild smoke`."""
    argv = [
        sys.executable, "-m", "sparkbuild.cli", "--project", str(REPO), "-q", "smoke",
        "--command", launcher, "--profile", "cpu-reference", "--model", model, "--json",
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    verdict = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"sparkbuild smoke failed:\n{done.stdout}\n{done.stderr}")
    return float(json.loads(done.stdout)["boot_seconds"]), verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    options = parser.parse_args()
    launcher, model = vllm_server_command(), str(tiny_llama())
    for round_number in range(1, options.rounds + 1):
        bare_boot, bare_total = bare_run(launcher, model)
        boot, verdict = smoke_run(launcher, model)
        bare_after, smoke_after = bare_total - bare_boot, verdict - boot
        print(f"round {round_number}:")
        print(f"  bare script: boot {bare_boot:6.1f} s, requests+stop {bare_after:5.1f} s")
        print(f"  smoke:       boot {boot:6.1f} s, requests+checks+stop {smoke_after:5.1f} s")
        print(
            f"  time to verdict {verdict:.1f} s / engine boot {boot:.1f} s = {verdict / boot:.2f}"
        )
        overhead = (smoke_after - bare_after) / boot
        print(f"  harness overhead vs bare script, share of boot: {overhead:+.1%}")


if __name__ == "__main__":
    main()
