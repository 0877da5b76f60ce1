"""``sparkbuild report`` on a lock of 50 builds, against loading that lock alone.

The lock is made here with the lock's own models and written by ``lockfile.dumps``: every
build has a source section (6 PRs, 3 patches), an image, 3 pinned wheels, 2 preflight runs,
smoke records of 3 profiles for the current and the previous image, a bench record of 12
cells for each, and a publish history. It is committed to a git repository over
``--revisions`` revisions (each a new image of every build, published), so the report reads
dates with ``git blame`` and finds each build's previous published image in the history, as
it does in a real project. Bench run JSON files are not read (``--bench-runs`` is off), and
the project has no ``builds/`` (the report of a lock alone: no publish gates are shown).

Each round times, in this process and alternately, wall and CPU time of:

- ``lockfile.load`` of the lock: the reference, what every command pays;
- the report's phases on their own: the dates (``git blame`` and each record's lines, from
  the node tree the load gave) and the previous entries (each build's previous published
  image found in the lock's git history, its entry read and validated);
- ``report.write_site``: all of it (load, dates, history, every page rendered and written,
  the directory swapped in); what the phases leave is the views, rendering and writing.

Medians over ``--rounds`` rounds. A revision's text is indexed once per process, so rounds
after the first skip that (about 25 ms here); the whole command, run ``--rounds`` times as a user
starts it (``python -m sparkbuild report``: interpreter, imports and template compilation
count too), does not. On a shared host the CPU times are the steadier figures.

    python benchmarks/bench_report.py [--builds 50] [--revisions 4] [--rounds 7]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sparkbuild import lockfile
from sparkbuild.checks import Status
from sparkbuild.publish.record import after_push
from sparkbuild.report import ReportOptions, dates, sides, write_site
from sparkbuild.settings import Settings

ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@localhost",
}
PROFILES = ("qwen3.6-27b-fp8-nextn-sglang", "qwen3.6-27b-fp8-ngram-sglang", "cpu-reference")


def hexes(seed: str, length: int = 64) -> str:
    return (hashlib.sha256(seed.encode()).hexdigest() * 2)[:length]


def digest(seed: str) -> str:
    return "sha256:" + hexes(seed)


def bench_record(seed: str) -> lockfile.BenchRecord:
    cells = [
        lockfile.BenchCell(
            pp=pp, tg=128, depth=0, concurrency=c, ttft_s=0.2 * pp / 512,
            prefill_tps=2400.0, decode_tps_request=60.0 / c**0.3,
            decode_tps_aggregate=60.0 * c**0.7, decode_tps_engine=61.0 / c**0.3,
            burst_runs=1 if c == 8 else 0, accept_len=2.4, errors=0,
        )
        for pp in (512, 2048, 8192)
        for c in (1, 2, 4, 8)
    ]  # fmt: skip
    return lockfile.BenchRecord(
        label=f"run {seed}", created="2026-11-20T10:00:00Z", harness="1", seed=0, runs=3,
        engine_args=["--speculative-algorithm", "NEXTN", "--mem-fraction-static", "0.8"],
        host="spark-1/aarch64/20cpu", cells=cells,
    )  # fmt: skip


def build_entry(
    name: str, revision: int, before: lockfile.BuildEntry | None
) -> lockfile.BuildEntry:
    image_id = digest(f"{name}-image-{revision}")
    tree = hexes(f"{name}-tree-{revision}", 40)
    source = lockfile.SourceSection(
        engine="sglang", repo="https://github.com/sgl-project/sglang", ref=f"v0.5.{12 + revision}",
        commit=hexes(f"{name}-commit-{revision}", 40), version=f"0.5.{12 + revision}",
        spec_digest=digest(f"{name}-spec-{revision}"), tree=tree,
        prs=[lockfile.LockedPR(number=20000 + n, status="applied" if n % 3 else "upstream",
                               head=hexes(f"{name}-pr-{n}-{revision}", 40), commits=[],
                               diff_sha256=hexes(f"{name}-diff-{n}"))
             for n in range(6)],
        patches=[lockfile.LockedPatch(file=f"patches/sglang/fix-{n}.patch", when=">=0.5.12",
                                      status="applied", sha256=hexes(f"{name}-patch-{n}"))
                 for n in range(3)],
    )  # fmt: skip
    image = lockfile.ImageSection(
        mode="overlay", base_image="lmsysorg/sglang:v0.5.12-cu130", base_digest=digest("base"),
        platform="linux/arm64", tree=tree, inputs_digest=digest(f"{name}-inputs-{revision}"),
        image_id=image_id, tags=[f"ghcr.io/example/{name}:0.5.{12 + revision}"],
    )  # fmt: skip
    wheels = [
        lockfile.LockedWheel(requirement=f"pkg{n}=={revision}.0", name=f"pkg{n}",
                             version=f"{revision}.0", sha256=hexes(f"{name}-wheel-{n}-{revision}"),
                             filename=f"pkg{n}-{revision}.0-py3-none-any.whl")
        for n in range(3)
    ]  # fmt: skip
    checks: dict[str, Status] = {"compile": "pass", "imports": "pass"}
    preflight = {
        f"{tree}+{digest(f'{name}-deps-{k}')}": lockfile.PreflightRun(
            where="image" if k == 0 else "venv", image_id=image_id if k == 0 else None, tree=tree,
            deps_digest=digest(f"{name}-deps-{k}"), versions={"sglang": "0.5.12"}, checks=checks,
            profiles={p: lockfile.ProfileVerdict(verdict="pass", checks={"config": "pass"})
                      for p in PROFILES},
        )
        for k in range(2)
    }  # fmt: skip
    smoke = {
        image_id: {
            p: lockfile.SmokeRecord(
                verdict="pass", checks={"boot": "pass", "accept_len": "pass", "nan": "pass"},
                accept_len=2.4, boot_seconds=180.0, engine="sglang", engine_version="0.5.12",
                nan_signal="SGLANG_ENABLE_NAN_DETECTION", target=f"image:{name}", verified=True,
                image_id=image_id,
            )
            for p in PROFILES
        }
    }  # fmt: skip
    bench = {image_id: {PROFILES[0]: bench_record(f"{name}-{revision}")}}
    if before is not None:  # the previous image's records stay beside the new one's
        old = before.image.image_id if before.image else None
        if old and before.smoke and before.bench:
            smoke[old] = before.smoke[old]
            bench[old] = before.bench[old]
    publication = lockfile.Publication(
        digest=digest(f"{name}-pushed-{revision}"), image_id=image_id, tag=f"0.5.{12 + revision}",
        verified=True, smoke=dict.fromkeys(PROFILES, "pass"),
    )  # fmt: skip
    earlier = before.publish.get("ghcr.io/example/" + name) if before and before.publish else None
    record = after_push(earlier, publication, ["latest"])
    return lockfile.BuildEntry(
        source=source, image=image, requirements=wheels, preflight=preflight, smoke=smoke,
        bench=bench, publish={"ghcr.io/example/" + name: record},
    )  # fmt: skip


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, env=ENV, check=True, capture_output=True)


def make_project(root: Path, builds: int, revisions: int) -> Path:
    """A project whose images.lock went through ``revisions`` commits."""
    git(root, "init", "-q", "-b", "main")
    lock = lockfile.LockFile()
    for revision in range(revisions):
        for n in range(builds):
            name = f"sglang-{n:02d}"
            lock.builds[name] = build_entry(name, revision, lock.builds.get(name))
        (root / "images.lock").write_text(lockfile.dumps(lock), encoding="utf-8")
        git(root, "add", "images.lock")
        git(root, "commit", "-q", "-m", f"revision {revision}")
    return root / "images.lock"


def timed(action: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds): on a shared host the CPU time is closer
    to what an idle machine would take."""
    wall, cpu = time.perf_counter(), time.process_time()
    action()
    return time.perf_counter() - wall, time.process_time() - cpu


def timed_child(command: list[str]) -> tuple[float, float]:
    """(wall seconds, the child's CPU seconds, user and system) of a command run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def previous_entries(lock_path: Path, lock: lockfile.LockFile) -> None:
    """What the report reads of the lock's history: each build's previous published entry."""
    history = sides.LockHistory(lock_path, lock)
    for name, entry in lock.builds.items():
        image_id = sides.previous_published(entry)
        if image_id is not None:
            sides.side_for_image(f"{name}@published~1", name, image_id, history)


def summary(name: str, times: list[tuple[float, float]]) -> tuple[float, float]:
    wall = statistics.median(t[0] for t in times)
    cpu = statistics.median(t[1] for t in times)
    print(f"{name}: median {wall:.3f} s wall (min {min(t[0] for t in times):.3f}), "
          f"{cpu:.3f} s CPU")  # fmt: skip
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", type=int, default=50)
    parser.add_argument("--revisions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        root = Path(tmp) / "project"
        root.mkdir()
        lock_path = make_project(root, args.builds, args.revisions)
        size = lock_path.stat().st_size
        lines = lock_path.read_text().count("\n")
        print(f"lock: {args.builds} builds, {lines} lines, {size / 1024:.0f} KiB, "
              f"{args.revisions} revisions in git")  # fmt: skip
        settings = Settings(project_dir=root, cache_dir=Path(tmp) / "cache")
        options = ReportOptions(out=Path(tmp) / "site")
        pages = len(write_site(settings, options).pages)  # warm: imports, the file cache
        lock, tree = lockfile.load_with_tree(lock_path)
        print(f"host load before (1, 5, 15 min): {os.getloadavg()}")
        times: dict[str, list[tuple[float, float]]] = {
            "load": [], "dates": [], "previous": [], "report": [],
        }  # fmt: skip
        for _ in range(args.rounds):
            times["load"].append(timed(lambda: lockfile.load(lock_path)))
            times["dates"].append(timed(lambda: dates.tree_dates(lock_path, tree)))
            times["previous"].append(timed(lambda: previous_entries(lock_path, lock)))
            times["report"].append(timed(lambda: write_site(settings, options)))
        load_wall, load_cpu = summary("load the lock (reference)", times["load"])
        phases = [
            summary("  report phase: dates (git blame, record lines)", times["dates"]),
            summary("  report phase: previous published entries", times["previous"]),
        ]
        wall, cpu = summary(f"write the report ({pages} pages)", times["report"])
        rest = (wall - load_wall - sum(p[0] for p in phases),
                cpu - load_cpu - sum(p[1] for p in phases))  # fmt: skip
        print(f"  the rest (views, rendering, writing): {rest[0]:.3f} s wall, {rest[1]:.3f} s CPU")
        print(f"ratio report / load: {wall / load_wall:.2f}x wall, {cpu / load_cpu:.2f}x CPU")
        command = [sys.executable, "-m", "sparkbuild", "--project", str(root), "--quiet",
                   "report", "--out", str(Path(tmp) / "site-cli")]  # fmt: skip
        whole = [timed_child(command) for _ in range(args.rounds)]
        summary("`python -m sparkbuild report`, whole process", whole)
        print(f"host load after (1, 5, 15 min): {os.getloadavg()}")


if __name__ == "__main__":
    main()
