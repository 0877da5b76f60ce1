"""What the deep checks cost: the CPU reference's deep smoke against its plain smoke, measured
alternately in one run on the real vLLM CPU engine.

Plain: `sparkbuild smoke --command ... --profile P` with a copy of the CPU reference that
declares no deep check. Deep: `sparkbuild smoke --deep ...` with the CPU reference as it
ships (every deep check, lossless's second boot included). Each is timed from process start
to exit; the rounds alternate so a loaded host weighs on both alike. Prints each round, the
medians and the ratio (the goal: deep at most 2x plain). The engine's own boot and each deep
phase's share come from the deep run's progress lines.

    python benchmarks/bench_deep_smoke.py [--rounds N]

Last run (2026-11-25, one round, 2 cores shared with other helpers' work at load 17-28):
plain 108.8 s, deep 640.3 s: deep / plain = 5.89, short of the 2x goal. Where the deep run's
time went (its progress lines, same host): the second boot (75-90 s at that load, about the
plain run's own boot), three burn-in rounds of six 48-token requests, one sampled generation
of 914 tokens, a 981-token prompt, two chat answers, and the reference's four requests. The
long generation and the burn-in rounds are most of it; on a quiet host each boot is ~21 s.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.vllm_cpu import tiny_llama, vllm_server_command  # noqa: E402

DEEP = ("lossless", "long_output", "acceptance_per_position", "burn_in", "long_context", "chat")


def _project(root: Path) -> Path:
    """A project with the CPU reference as shipped and a copy that declares nothing deep."""
    (root / "smoke").mkdir(parents=True)
    shipped = REPO / "smoke" / "cpu-reference.yaml"
    shutil.copyfile(shipped, root / "smoke" / "cpu-reference.yaml")
    plain = yaml.safe_load(shipped.read_text(encoding="utf-8"))
    for name in DEEP:
        plain["expect"].pop(name, None)
    plain.pop("deep_request", None)
    (root / "smoke" / "plain.yaml").write_text(yaml.safe_dump(plain), encoding="utf-8")
    return root


def _timed(project: Path, *args: str) -> tuple[float, str]:
    sparkbuild = Path(sys.executable).parent / "sparkbuild"
    argv = [str(sparkbuild), "--project", str(project), "smoke", "--command",
            vllm_server_command(), "--model", str(tiny_llama()), *args]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    return seconds, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    rounds = parser.parse_args().rounds
    plain: list[float] = []
    deep: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        project = _project(Path(tmp))
        for index in range(rounds):
            seconds, _ = _timed(project, "--profile", "plain")
            plain.append(seconds)
            print(f"round {index + 1}: plain {seconds:.1f} s", flush=True)
            seconds, _ = _timed(project, "--deep", "--profile", "cpu-reference")
            deep.append(seconds)
            print(f"round {index + 1}: deep  {seconds:.1f} s", flush=True)
    plain_s, deep_s = statistics.median(plain), statistics.median(deep)
    print(f"median plain {plain_s:.1f} s, deep {deep_s:.1f} s: deep / plain = "
          f"{deep_s / plain_s:.2f} (goal <= 2.0, the second boot included)")  # fmt: skip


if __name__ == "__main__":
    main()
