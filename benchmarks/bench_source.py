"""Preparing a build (5 PRs, 5 patches) with sparkbuild against the same work in plain git.

The repository is made here with ``git fast-import``: thousands of files and commits, a
release tag, a main that moves on, and five open PRs forked from a later main (so each PR's
own commits must be picked out). Both sides start from a warm mirror; each side is timed
over several runs in the same process and the medians are compared.

    python benchmarks/bench_source.py [--files 4000] [--commits 3000] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@localhost",
}
PRS = (11, 12, 13, 14, 15)


def git(cwd: Path, *args: str, input: bytes | None = None) -> str:
    result = subprocess.run(
        ["git", *args], cwd=cwd, env=ENV, input=input, capture_output=True, check=True
    )
    return result.stdout.decode().strip()


def file_text(index: int, revision: int) -> str:
    body = "".join(f"    value_{index}_{line} = {line}  # line {line}\n" for line in range(40))
    return f"# module {index} revision {revision}\ndef f_{index}():\n{body}    return 0\n"


def fast_import_stream(files: int, commits: int, tag_at: int) -> bytes:
    """An import stream: one big first commit, then small commits touching one file each."""
    out: list[str] = []
    for number in range(commits):
        out.append("commit refs/heads/main\n")
        out.append(f"mark :{number + 1}\n")
        out.append(f"committer bench <bench@localhost> {1_700_000_000 + number * 60} +0000\n")
        message = f"commit {number}\n"
        out.append(f"data {len(message)}\n{message}")
        if number:
            out.append(f"from :{number}\n")
        touched = range(files) if number == 0 else [(number * 7919) % files]
        for index in touched:
            # Files 0..99 are left to the PRs and patches so they always apply.
            revision = 0 if index < 100 else number
            text = file_text(index, revision)
            path = f"python/pkg/m{index // 100:03d}/f{index:05d}.py"
            out.append(f"M 644 inline {path}\ndata {len(text.encode())}\n{text}")
        out.append("\n")
        if number == tag_at:
            out.append(f"reset refs/tags/v1.0.0\nfrom :{number + 1}\n\n")
    return "".join(out).encode()


def make_repository(root: Path, files: int, commits: int) -> Path:
    work = root / "work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    git(work, "fast-import", "--quiet", input=fast_import_stream(files, commits, commits * 2 // 3))
    git(work, "checkout", "-q", "-f", "main")
    for offset, number in enumerate(PRS):
        git(work, "checkout", "-q", "-b", f"pr{number}", "main")
        for step in range(2):  # two commits per PR
            path = work / f"python/pkg/m000/f{offset * 10 + step:05d}.py"
            path.write_text(path.read_text().replace("return 0", f"return {number}{step}"))
            git(work, "commit", "-q", "-am", f"PR {number} step {step}")
        git(work, "checkout", "-q", "main")
    bare = root / "upstream.git"
    git(root, "clone", "-q", "--bare", str(work), str(bare))
    for number in PRS:
        git(bare, "update-ref", f"refs/pull/{number}/head", f"refs/heads/pr{number}")
    return work


def make_project(root: Path, work: Path, upstream: Path) -> Path:
    project = root / "project"
    (project / "builds").mkdir(parents=True)
    (project / "patches").mkdir()
    git(work, "checkout", "-q", "--detach", "v1.0.0")
    for number in range(5):
        path = work / f"python/pkg/m000/f{60 + number:05d}.py"
        path.write_text(path.read_text().replace("line 3\n", f"line 3 (patch {number})\n"))
        diff = git(work, "diff")
        git(work, "checkout", "-q", "--", ".")
        (project / "patches" / f"p{number}.patch").write_text(f"Patch {number}.\n\n{diff}\n")
    git(work, "checkout", "-q", "main")
    prs = "".join(f"  - {{number: {n}}}\n" for n in PRS)
    patches = "".join(f"  - {{file: patches/p{n}.patch}}\n" for n in range(5))
    (project / "builds" / "pkg.yaml").write_text(
        f"engine: sglang\nrepo: {upstream}\npackage_dir: python/pkg\nprs:\n{prs}"
        f"patches:\n{patches}builds:\n  bench:\n    ref: v1.0.0\n"
    )
    return project


def plain_git(mirror: Path, upstream: Path, project: Path, out: Path) -> str:
    """What a careful person does by hand: fetch, check out the tag, pick each PR's own
    commits (from where it left main), apply each patch, and take the tree hash."""
    refspecs = ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"]
    refspecs += [f"+refs/pull/{n}/head:refs/pull/{n}/head" for n in PRS]
    git(mirror, "fetch", "-q", str(upstream), *refspecs)
    if out.exists():
        git(mirror, "worktree", "remove", "--force", str(out))
    git(mirror, "worktree", "add", "-q", "--detach", str(out), "v1.0.0")
    for number in PRS:
        fork = git(mirror, "merge-base", f"refs/pull/{number}/head", "main")
        git(out, "cherry-pick", "-x", f"{fork}..refs/pull/{number}/head")
    for patch in sorted((project / "patches").glob("*.patch")):
        git(out, "apply", "--index", str(patch))
    return git(out, "write-tree")


def sparkbuild_prepare(project: Path, cache: Path, out: Path) -> str:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparkbuild",
            "--project",
            str(project),
            "--cache-dir",
            str(cache),
            "--quiet",
            "prepare",
            "bench",
            "--out",
            str(out),
        ],
        capture_output=True,
        check=True,
    )
    return result.stdout.decode().strip()


def timed(function: object, *args: object) -> tuple[float, str]:
    start = time.perf_counter()
    value = function(*args)  # type: ignore[operator]
    return time.perf_counter() - start, str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--commits", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-source-") as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        work = make_repository(root, args.files, args.commits)
        upstream = root / "upstream.git"
        project = make_project(root, work, upstream)
        print(
            f"repository: {args.files} files, {args.commits + 10} commits, "
            f"made in {time.perf_counter() - start:.1f}s"
        )

        mirror = root / "plain-mirror.git"
        git(root, "clone", "-q", "--mirror", str(upstream), str(mirror))
        cache = root / "cache"
        cold, _ = timed(sparkbuild_prepare, project, cache, root / "sb-out")
        plain_times, sb_times, rerun_times = [], [], []
        trees = set()
        for _ in range(args.runs):
            # Both sides check out into a fresh directory from a warm mirror.
            seconds, tree = timed(plain_git, mirror, upstream, project, root / "plain-out")
            plain_times.append(seconds)
            trees.add(("plain git", tree))
            shutil.rmtree(root / "sb-out", ignore_errors=True)
            seconds, tree = timed(sparkbuild_prepare, project, cache, root / "sb-out")
            sb_times.append(seconds)
            trees.add(("sparkbuild", tree))
            seconds, _ = timed(sparkbuild_prepare, project, cache, root / "sb-out")
            rerun_times.append(seconds)

    plain, sb = statistics.median(plain_times), statistics.median(sb_times)
    rerun = statistics.median(rerun_times)
    print(f"plain git, warm mirror, fresh worktree:   median {plain:.3f}s ({args.runs} runs)")
    print(f"sparkbuild prepare, warm mirror, new out: median {sb:.3f}s ({args.runs} runs)")
    print(f"sparkbuild prepare, warm re-run same out: median {rerun:.3f}s")
    print(f"sparkbuild prepare, cold mirror:          {cold:.3f}s")
    print(
        f"ratio sparkbuild / plain git: {sb / plain:.2f}x (target <= 1.5x); "
        f"warm re-run {rerun / plain:.2f}x"
    )
    same = len({tree for _, tree in trees}) == 1
    print(f"same tree from both: {same} {sorted(trees)}")


if __name__ == "__main__":
    main()
