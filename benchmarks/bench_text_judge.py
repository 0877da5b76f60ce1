"""How the long-text judge's time grows with the answer's length: the judge of this tree
against the one before structure was read as structure (git revision ``--old``, default
``dd0a177``: its restated-sentence rule counted the words before every sentence again),
each on prose of 38, 76, 152 and 304 KB, alternately, in one run.

Linear doubles with the length (ratio about 2 per doubling); quadratic quadruples. Prints
each size's seconds for both and the ratio between successive sizes.

    python benchmarks/bench_text_judge.py [--old REV] [--rounds N]

Runs (2026-11-27, 2 cores shared with other helpers' work, load average 11):

- old (dd0a177): 38 KB 1.04 s, 76 KB 2.99 s, 152 KB 6.41 s, 304 KB 32.67 s: x2.87, x2.15,
  x5.10 per doubling (the issue's 304 KB answer, with longer sentences, took 307 s);
- new: 38 KB 0.07 s, 76 KB 0.10 s, 152 KB 0.17 s, 304 KB 0.28 s: x1.36, x1.82, x1.62 per
  doubling (the start-up share shrinks as the text grows): linear, 117x faster at 304 KB.
  An answer past 128 characters a token of its ``max_tokens`` is not judged at all.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = (38_000, 76_000, 152_000, 304_000)
_TIME = """
import inspect, sys, time
from sparkbuild.engines.profiles import TextLimits
from sparkbuild.smoke.deep import text
given = open(sys.argv[1], encoding="utf-8").read()
old = list(inspect.signature(text.judge).parameters)[0] == "units"  # judge(units, text, ...)
start = time.perf_counter()
text.judge(text.words(given), given, TextLimits()) if old else text.judge(given, TextLimits())
print(time.perf_counter() - start)
"""


def prose(size: int, seed: int = 0) -> str:
    """Varied sentences of ``size`` characters: words from a list of 5000, no loop."""
    rng = random.Random(seed)
    vocabulary = [
        "".join(rng.choice("abcdefghijklmnoprstuvw") for _ in range(rng.randint(2, 9)))
        for _ in range(5000)
    ]
    out: list[str] = []
    length = 0
    while length < size:
        sentence = " ".join(rng.choice(vocabulary) for _ in range(rng.randint(6, 20)))
        out.append(sentence.capitalize() + ". ")
        length += len(out[-1])
    return "".join(out)[:size]


def _tree(revision: str, folder: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "src"], capture_output=True, check=True
    ).stdout
    folder.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder / "src"


def _seconds(src: Path, path: Path) -> float:
    done = subprocess.run(
        [sys.executable, "-c", _TIME, str(path)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
    )
    return float(done.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="dd0a177")
    parser.add_argument("--rounds", type=int, default=1)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        old = _tree(options.old, Path(scratch) / "old")
        texts = {size: Path(scratch) / f"{size}.txt" for size in SIZES}
        for size, path in texts.items():
            path.write_text(prose(size), encoding="utf-8")
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(options.rounds):
            for size, path in texts.items():
                for label, src in (("old", old), ("new", ROOT / "src")):
                    times.setdefault((label, size), []).append(_seconds(src, path))
                    print(f"{label} {size // 1000} KB: {times[label, size][-1]:.2f} s", flush=True)
    for label in ("old", "new"):
        medians = [statistics.median(times[label, size]) for size in SIZES]
        steps = [later / earlier for earlier, later in itertools.pairwise(medians)]
        shown = ", ".join(
            f"{size // 1000} KB {m:.2f} s" for size, m in zip(SIZES, medians, strict=False)
        )
        print(f"{label}: {shown}; x per doubling: {', '.join(f'{s:.2f}' for s in steps)}")
    print(f"start {time.strftime('%H:%M:%S')}")


if __name__ == "__main__":
    main()
