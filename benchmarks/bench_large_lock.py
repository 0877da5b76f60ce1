"""``report``, ``patches``, ``lock --check`` and ``verify`` on a lock at the lock's size limit,
against the same commands on a lock of ordinary size, run alongside (issue 46, What 4).

Two projects are made the same way: a local upstream with tags and PR refs
(``tests/support/gitrepos.make_upstream``), one build locked by the real ``sparkbuild lock``,
then an image, smoke records and bench records added to its entry with the lock's own models,
as a build tested and benchmarked again and again accumulates them (the lock keeps every
image's records), and the lock committed to git (the report reads dates with ``git blame``).
The reference lock holds 50 images' records (about 1 MiB); the large one as many as fit under
``--mib`` (default: the lock's limit, ``lockfile.LOCK_LIMIT``), about 1,000 bench cells per
image. A third lock, one MiB over the limit, is only read: it must be refused before it is
read, naming the limit.

Each command runs as a user starts it (``python -m sparkbuild``), ``--rounds`` times per lock,
alternately, and reports the medians of its wall time, its CPU time (user and system, the
child and the git it runs) and its peak resident memory (the largest process of the command).
``verify`` is given a key and a registry address where nothing listens: it reads the lock
before it asks the registry (an oversized lock is refused without a connection), so its
figures are the lock's cost; it exits 1 either way.

    python benchmarks/bench_large_lock.py [--mib 16] [--rounds 3]

The budget (issue 46): within 3 minutes and 2 GB on this 2-core host, or refused before
reading. On a shared host the CPU times are the steadier figures.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.gitrepos import git, make_upstream  # noqa: E402

from sparkbuild import fileio, lockfile  # noqa: E402

SPEC = """\
engine: sglang
repo: REPO
package_dir: python/pkg
builds:
  pkg-new:
    ref: v1.1.0
    prs: [{number: 104}]
    smoke: [cpu-reference]
"""
PROFILE = "cpu-reference"
CELLS_PER_IMAGE = 1000
BUDGET_SECONDS = 180
TIME = "/usr/bin/time"  # GNU time (Debian's `time` package)
BUDGET_MIB = 2048


def digest(seed: str) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(seed.encode()).hexdigest()


def bench_record(image: int, cells: int) -> lockfile.BenchRecord:
    """A sweep of ``cells`` cells, as `bench --record` keeps it."""
    made = [
        lockfile.BenchCell(
            pp=512 * (1 + n % 8), tg=128, depth=1024 * (n // 32), concurrency=1 + n % 4,
            ttft_s=0.2 + n / 1e4, prefill_tps=2400.0 - n / 100, decode_tps_request=60.0 - n / 1e3,
            decode_tps_aggregate=120.0 + n / 1e3, decode_tps_engine=61.0, burst_runs=n % 2,
            accept_len=2.4, errors=0,
        )
        for n in range(cells)
    ]  # fmt: skip
    return lockfile.BenchRecord(
        label=f"run {image}", created="2026-11-20T10:00:00Z", harness="1", seed=0, runs=3,
        engine_args=["--speculative-algorithm", "NEXTN"], host="spark-1/aarch64/20cpu",
        cells=made,
    )  # fmt: skip


def smoke_record(image_id: str) -> lockfile.SmokeRecord:
    return lockfile.SmokeRecord(
        verdict="pass", checks={"boot": "pass", "nan": "pass"}, accept_len=2.4,
        boot_seconds=180.0, engine="sglang", engine_version="1.1.0", target=f"image:{image_id}",
        verified=True, image_id=image_id,
    )  # fmt: skip


def _write(path: Path, lock: lockfile.LockFile) -> None:
    """The lock as ``lockfile.dumps`` lays it out, through libyaml's emitter: the pure-Python
    one takes minutes for a lock this size, which is not what is measured here."""
    header = lockfile.HEADER
    body = yaml.dump(
        lock.to_json(), Dumper=yaml.CSafeDumper, sort_keys=True, allow_unicode=True, width=80,
        default_flow_style=False,
    )  # fmt: skip
    path.write_text(header + body, encoding="utf-8")


def make_project(root: Path, upstream_url: str, target_bytes: int) -> Path:
    """A project locked by `sparkbuild lock`, its entry grown to about ``target_bytes``."""
    (root / "builds").mkdir(parents=True)
    (root / "builds" / "pkg.yaml").write_text(SPEC.replace("REPO", upstream_url))
    cache = root.parent / f"{root.name}-cache"
    command = [sys.executable, "-m", "sparkbuild", "--project", str(root), "--cache-dir"]
    subprocess.run([*command, str(cache), "--quiet", "lock"], check=True, capture_output=True)
    lock_path = root / "images.lock"
    lock = lockfile.load(lock_path)
    entry = lock.builds["pkg-new"]
    current = digest("image-current")
    entry.image = lockfile.ImageSection(mode="overlay", image_id=current, platform="linux/arm64")
    smoke: dict[str, dict[str, lockfile.SmokeRecord]] = {}
    bench: dict[str, dict[str, lockfile.BenchRecord]] = {}
    entry.smoke, entry.bench = smoke, bench

    def grow(images: int) -> None:
        for n in range(len(bench), images):
            image_id = current if n == 0 else digest(f"image-{n}")
            smoke[image_id] = {PROFILE: smoke_record(image_id)}
            bench[image_id] = {PROFILE: bench_record(n, CELLS_PER_IMAGE)}

    grow(1)
    _write(lock_path, lock)
    one = lock_path.stat().st_size
    grow(2)
    _write(lock_path, lock)
    per_image = lock_path.stat().st_size - one  # what each image's records add
    images = max(1, 1 + (target_bytes - one) // per_image)
    grow(images)
    _write(lock_path, lock)
    return lock_path


def commit(lock_path: Path) -> Path:
    root = lock_path.parent
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "the lock")
    return lock_path


@dataclass(frozen=True)
class Measured:
    wall: float
    cpu: float
    peak_mib: float
    exit_code: int
    said: str


def measure(command: list[str]) -> Measured:
    """One run of ``command`` to its end under GNU time: wall, CPU (its own and the children
    it waited for, such as git) and the peak resident memory of its largest process, then
    its exit status and first line. Measured by GNU time, not by this process's wait4: a
    child forked from this process starts with this process's resident set, the large lock's
    models among it, until it execs."""
    with tempfile.NamedTemporaryFile() as out, tempfile.NamedTemporaryFile("r") as usage:
        timed = [TIME, "-f", "%e %U %S %M", "-o", usage.name, *command]
        done = subprocess.run(timed, stdout=out, stderr=subprocess.STDOUT, check=False)
        wall, user, system, peak_kib = usage.read().split()[-4:]
        said = Path(out.name).read_text(errors="replace").strip().splitlines()
    return Measured(
        float(wall), float(user) + float(system), int(peak_kib) / 1024, done.returncode,
        said[0][:160] if said else "",
    )  # fmt: skip


def commands(project: Path, cache: Path, key: Path, out: Path) -> dict[str, list[str]]:
    base = [sys.executable, "-m", "sparkbuild", "--project", str(project), "--cache-dir",
            str(cache), "--quiet"]  # fmt: skip
    nowhere = "127.0.0.1:9/example/pkg@" + digest("published")
    return {
        "lock --check": [*base, "lock", "--check"],
        "patches": [*base, "patches"],
        "report": [*base, "report", "--out", str(out)],
        "verify": [*base, "verify", nowhere, "--key", str(key)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=lockfile.LOCK_LIMIT / fileio.MIB)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-large-lock-") as tmp:
        work = Path(tmp)
        upstream = make_upstream(work / "upstream")
        sizes = {"normal": 50 * 21_000, "large": int(args.mib * fileio.MIB)}
        locks = {
            name: make_project(work / name, upstream.url, size) for name, size in sizes.items()
        }
        over = make_project(work / "over", upstream.url, lockfile.LOCK_LIMIT + fileio.MIB)
        for name, path in [*locks.items(), ("over the limit", over)]:
            lines = path.read_text().count("\n")
            images = CELLS_PER_IMAGE * len(re.findall(r"^ +cells:$", path.read_text(), re.M))
            print(f"{name} lock: {path.stat().st_size / fileio.MIB:.1f} MiB, {lines} lines, "
                  f"{images} bench cells")  # fmt: skip
        environment = {**os.environ, "SPARKBUILD_SIGNING_PASSWORD": "bench-not-a-secret"}
        key = work / "cosign"
        subprocess.run([sys.executable, "-m", "sparkbuild", "keys", "generate",
                        "--output-prefix", str(key)], check=True, capture_output=True,
                       env=environment)  # fmt: skip
        public = key.with_suffix(".pub")
        print(f"host load before (1, 5, 15 min): {os.getloadavg()}")
        results: dict[tuple[str, str], list[Measured]] = {}
        for round_ in range(args.rounds):
            for name, path in locks.items():
                project = path.parent
                cache = project.parent / f"{project.name}-cache"
                for command, argv in commands(project, cache, public, work / "site").items():
                    results.setdefault((name, command), []).append(measure(argv))
            print(f"round {round_ + 1}/{args.rounds} done")
        over_runs = {
            command: measure(argv)
            for command, argv in commands(
                over.parent, over.parent.parent / "over-cache", public, work / "site"
            ).items()
        }
        print(f"host load after (1, 5, 15 min): {os.getloadavg()}")
        print()
        print("command       | normal: wall, CPU, peak | large: wall, CPU, peak | ratio "
              "(wall, CPU, peak) | within budget")  # fmt: skip
        for command in commands(work, work, public, work):
            normal, large = results["normal", command], results["large", command]
            n = _medians(normal)
            g = _medians(large)
            ok = g[0] < BUDGET_SECONDS and max(m.peak_mib for m in large) < BUDGET_MIB
            print(f"{command:13} | {n[0]:6.1f} s {n[1]:6.1f} s {n[2]:6.0f} MiB | "
                  f"{g[0]:6.1f} s {g[1]:6.1f} s {g[2]:6.0f} MiB | "
                  f"{g[0] / n[0]:5.1f}x {g[1] / n[1]:5.1f}x {g[2] / n[2]:4.1f}x | "
                  f"{'yes' if ok else 'NO'} (exit {large[-1].exit_code})")  # fmt: skip
        print()
        print(f"a lock over the limit ({over.stat().st_size / fileio.MIB:.1f} MiB):")
        for command, measured in over_runs.items():
            print(f"  {command:13} exit {measured.exit_code} in {measured.wall:.1f} s, "
                  f"{measured.peak_mib:.0f} MiB: {measured.said}")  # fmt: skip


def _medians(runs: list[Measured]) -> tuple[float, float, float]:
    return (
        statistics.median(m.wall for m in runs),
        statistics.median(m.cpu for m in runs),
        statistics.median(m.peak_mib for m in runs),
    )


if __name__ == "__main__":
    main()
