"""What the deep checks cost: the CPU reference's deep smoke against its plain smoke, measured
alternately in one run on the real vLLM CPU engine.

Plain: `sparkbuild smoke --command ... --profile P` with a copy of the CPU reference that
declares no deep check. Deep: `sparkbuild smoke --deep ...` with the CPU reference as it
ships (every deep check, lossless's second boot included). Each is timed from process start
to exit; the rounds alternate so a loaded host weighs on both alike. Prints each round, the
medians and the ratio (the goal: deep at most 2x plain). The engine's own boot and each deep
phase's share come from the deep run's progress lines.

    python benchmarks/bench_deep_smoke.py [--rounds N]

Runs (2026-11-25, 2 cores shared with other helpers' work and CI; load average as `uptime`
showed it at the start and end of each run):

- before (burn-in's round 1 its own, three rounds of six; 914-token long output; every
  phase one after another): at load 2.8-4.4, plain 30.0 s, deep 80.3 s, 2.68x (one round);
  an earlier run at load 17-28: plain 108.8 s, deep 640.3 s, 5.89x.
- after (burn-in's round 1 is the smoke's own requests; 512-token long output; long
  output, long context and chat at the same time), three one-round runs: at load 14.7-22.2,
  plain 112.9 s, deep 254.1 s, 2.25x; at load 11.0-11.7, plain 65.3 s, deep 174.0 s, 2.67x;
  at load 6.9-9.7, plain 58.3 s, deep 105.0 s, 1.80x. Their median is 2.25x: around the 2x
  goal, with the host's load moving each run by more than the cuts did.
- on a quiet host (load 0.8-1.6, nothing else running), three rounds each: plain 22.0 s,
  deep 45.0 s, 2.05x; then, with an engine's stop no longer waiting for its exited workers
  to be reaped by init (1.7 s -> 0.4 s per stop, `targets.group_running`), plain 22.5 s,
  deep 44.0 s, 1.96x. A stop is in both runs (twice in the deep one), so that cut moves the
  ratio little; the rounds themselves vary by 1-3 s here.

Where the deep run's time goes (its progress lines; one run at load 3-4, plain 30 s): the
second boot for lossless's reference 17.7 s, the engine under test's stop before it 2.4 s
(0.4 s since the stop fix),
the reference's four requests 6 s (4.3 s of them the first request's warm-up, as in the plain
run): about 26 s, 0.85 of a plain run, for lossless alone. Burn-in's two rounds 1.3 s, the
914-token generation 5.1 s (512 tokens now), the long prompt 0.3 s, chat 0.6 s. So the 2x
goal is met only where the second boot is cheap against the plain run: the rest of the deep
checks cost a tenth of it. Booting the reference alongside the engine under test was tried
and measured slower here (58 s for the two boots at once against 20 s for one: two engines'
OpenMP threads on 2 shared cores).
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
