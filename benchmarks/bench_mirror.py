"""The first ``sparkbuild prepare`` on a partial mirror (blob filter) against a full mirror.

The upstream is made here with ``git fast-import``: a few thousand commits whose large files
keep changing (each commit rewrites a quarter of one file with new random text, so history
does not delta away), a release tag two thirds of the way, a PR and a patch. It is served
twice from the same objects: once with ``uploadpack.allowFilter`` (sparkbuild makes a partial
mirror) and once without (the server refuses the filter and sparkbuild fetches everything,
which is what every mirror did before partial clones). Each run starts from an empty cache
and runs ``sparkbuild prepare BUILD --out DIR``; the two sides alternate, in one process, and
the medians are compared. "Bytes" is what the fetches left in the mirror (its ``objects/``
directory: the packs as received, and loose objects for the smallest fetches).

    python benchmarks/bench_mirror.py [--commits 3000] [--files 16] [--kib 128] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import random
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
PR = 7


def git(cwd: Path, *args: str, input: bytes | None = None) -> str:
    result = subprocess.run(
        ["git", *args], cwd=cwd, env=ENV, input=input, capture_output=True, check=True
    )
    return result.stdout.decode().strip()


def _text(rng: random.Random, size: int) -> str:
    """Printable random text in 64-character lines (a diff still finds line boundaries)."""
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/"
    count = max(size // 65, 1)
    return "".join("".join(rng.choices(alphabet, k=64)) + "\n" for _ in range(count))


def fast_import(work: Path, commits: int, files: int, size: int, tag_at: int) -> None:
    """Stream into ``git fast-import``: one commit adding ``files`` files of ``size`` bytes,
    then commits that each rewrite a quarter of one of them (sizes stay the same; the small
    ``pkg/`` file stays put for the patch and the PR). Streamed, so memory stays flat."""
    rng = random.Random(26)
    contents = [_text(rng, size).splitlines(keepends=True) for _ in range(files)]
    importer = subprocess.Popen(
        ["git", "fast-import", "--quiet"], cwd=work, env=ENV, stdin=subprocess.PIPE
    )
    assert importer.stdin is not None
    for number in range(commits):
        message = f"commit {number}\n".encode()
        chunk = [b"commit refs/heads/main\nmark :%d\n" % (number + 1)]
        chunk.append(b"committer bench <bench@localhost> %d +0000\n" % (1_700_000_000 + number))
        chunk.append(b"data %d\n%s" % (len(message), message))
        if number:
            chunk.append(b"from :%d\n" % number)
        if number == 0:
            touched = list(range(files))
            pkg = "".join(f"line {i}\n" for i in range(40)).encode()
            chunk.append(b"M 644 inline python/pkg/core.py\ndata %d\n%s\n" % (len(pkg), pkg))
        else:
            index = rng.randrange(files)
            lines = contents[index]
            quarter = max(len(lines) // 4, 1)
            start = rng.randrange(len(lines) - quarter + 1)
            lines[start : start + quarter] = _text(rng, quarter * 65).splitlines(keepends=True)
            touched = [index]
        for index in touched:
            data = "".join(contents[index]).encode()
            chunk.append(
                b"M 644 inline data/blob%03d.txt\ndata %d\n%s\n" % (index, len(data), data)
            )
        chunk.append(b"\n")
        if number == tag_at:
            chunk.append(b"reset refs/tags/v1.0.0\nfrom :%d\n\n" % (number + 1))
        importer.stdin.write(b"".join(chunk))
    importer.stdin.close()
    if importer.wait() != 0:
        raise SystemExit("git fast-import failed")


def make_upstream(root: Path, commits: int, files: int, size: int) -> tuple[Path, Path]:
    """Two bare repositories sharing one object store: with and without filters allowed."""
    work = root / "work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    fast_import(work, commits, files, size, commits * 2 // 3)
    git(work, "checkout", "-q", "-f", "main")
    git(work, "checkout", "-q", "-b", "pr", "v1.0.0")
    core = work / "python/pkg/core.py"
    core.write_text(core.read_text().replace("line 30\n", "line 30 (PR)\n"))
    git(work, "commit", "-q", "-am", "PR: core line 30")
    git(work, "checkout", "-q", "main")
    source = root / "source.git"
    git(root, "clone", "-q", "--bare", str(work), str(source))
    git(source, "update-ref", f"refs/pull/{PR}/head", "refs/heads/pr")
    shutil.rmtree(work)
    served = []
    for name, allow in (("filtered.git", "true"), ("plain.git", "false")):
        bare = root / name
        git(root, "clone", "-q", "--bare", "--shared", str(source), str(bare))
        git(
            bare,
            "update-ref",
            f"refs/pull/{PR}/head",
            f"{git(source, 'rev-parse', 'refs/heads/pr')}",
        )
        git(bare, "config", "uploadpack.allowFilter", allow)
        served.append(bare)
    return served[0], served[1]


def make_project(root: Path, upstream: Path) -> Path:
    project = root / f"project-{upstream.stem}"
    (project / "builds").mkdir(parents=True)
    (project / "patches").mkdir()
    patch = (
        "Benchmark patch.\n\n"
        "--- a/python/pkg/core.py\n+++ b/python/pkg/core.py\n"
        "@@ -4,3 +4,3 @@\n line 3\n-line 4\n+line 4 (patched)\n line 5\n"
    )
    (project / "patches" / "core.patch").write_text(patch)
    (project / "builds" / "pkg.yaml").write_text(
        f"engine: sglang\nrepo: {upstream}\npackage_dir: python/pkg\n"
        f"prs:\n  - {{number: {PR}}}\npatches:\n  - {{file: patches/core.patch}}\n"
        "builds:\n  bench:\n    ref: v1.0.0\n"
    )
    return project


def first_prepare(project: Path, cache: Path, out: Path) -> tuple[float, int, str]:
    """Seconds, bytes the mirror holds afterwards, and the tree hash."""
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    result = subprocess.run(
        [
            *(sys.executable, "-m", "sparkbuild", "--project", str(project)),
            *("--cache-dir", str(cache), "--quiet", "prepare", "bench", "--out", str(out)),
        ],
        capture_output=True,
        check=True,
    )
    seconds = time.perf_counter() - start
    (mirror,) = (cache / "mirrors").glob("*.git")
    stored = sum(f.stat().st_size for f in (mirror / "objects").rglob("*") if f.is_file())
    return seconds, stored, result.stdout.decode().strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=3000)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--kib", type=int, default=128, help="size of each large file")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-mirror-") as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        filtered, plain = make_upstream(root, args.commits, args.files, args.kib * 1024)
        served = sum(
            f.stat().st_size for f in (root / "source.git/objects").rglob("*") if f.is_file()
        )
        print(
            f"upstream: {args.commits + 1} commits, {args.files} files of {args.kib} KiB, "
            f"{served / 2**20:.1f} MiB packed, made in {time.perf_counter() - start:.1f}s"
        )
        sides = {"partial": make_project(root, filtered), "full": make_project(root, plain)}
        seconds: dict[str, list[float]] = {side: [] for side in sides}
        stored: dict[str, list[int]] = {side: [] for side in sides}
        trees: set[str] = set()
        for _ in range(args.runs):
            for side, project in sides.items():  # alternating, so load hits both alike
                took, size, tree = first_prepare(project, root / "cache", root / "out")
                seconds[side].append(took)
                stored[side].append(size)
                trees.add(tree)
    for side in sides:
        print(
            f"{side:8} mirror, first prepare: median {statistics.median(seconds[side]):.2f}s "
            f"(runs {', '.join(f'{s:.2f}' for s in seconds[side])}), "
            f"{statistics.median(stored[side]) / 2**20:.1f} MiB fetched"
        )
    time_ratio = statistics.median(seconds["partial"]) / statistics.median(seconds["full"])
    byte_ratio = statistics.median(stored["partial"]) / statistics.median(stored["full"])
    print(f"ratio partial / full: time {time_ratio:.2f}x, bytes {byte_ratio:.3f}x")
    print(f"same tree from both: {len(trees) == 1} {sorted(trees)}")


if __name__ == "__main__":
    main()
