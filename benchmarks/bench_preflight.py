"""Preflight speed: cold venv setup against warm runs, for one build with three profiles.

The build is the shipped ``sglang-0.5.23-spark`` spec with three of its profiles, prepared by
the real source stage from the local git repository of real SGLang releases. Figures:

* cold: a new venv root (the shared torch base venv included, unless --keep-torch), then one
  preflight run; the issue's budget is for warm runs only;
* warm: ``--runs`` further runs with every venv and tree cached, each against the issue's
  2-minute budget, reported as a ratio of the cold time measured in the same run.

    python benchmarks/bench_preflight.py [--runs 3] [--keep-torch]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.cache import shared_test_cache
from tests.support.preflight_env import Project
from tests.support.sglang_releases import download_wheel

from sparkbuild.preflight import Where, run_preflight
from sparkbuild.source import prepare_source
from sparkbuild.spec import load_builds

BUILD = "sglang-0.5.23-spark"
PROFILES = [
    "qwen3.6-27b-fp8-nextn-sglang",
    "gemma4-31b-mtp-sglang",
    "nemotron3-super-nvfp4-mtp-sglang",
]
BUDGET_S = 120.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--keep-torch",
        action="store_true",
        help="reuse the shared torch base venv (cold = the release venv only)",
    )
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-preflight-") as tmp:
        base = Path(tmp)
        project = Project(base / "project", base / "cache")
        root = Path(__file__).resolve().parents[1]
        (project.path / "builds" / "sglang.yaml").write_text(
            (root / "builds" / "sglang.yaml").read_text()
        )
        venvs = base / "venvs"
        if options.keep_torch:
            venvs.mkdir()
            for torch in (shared_test_cache() / "preflight-venvs").glob("torch-*"):
                if torch.is_dir():
                    (venvs / torch.name).symlink_to(torch)
        build = load_builds(project.settings)[BUILD]
        prepared = prepare_source(build, project.settings)
        where = Where(
            venv_root=venvs, wheel=download_wheel(str(build.version), shared_test_cache())
        )
        began = time.perf_counter()
        report = run_preflight(project.settings, prepared, PROFILES, where)
        cold = time.perf_counter() - began
        print(f"cold (venv setup + first run): {cold:.1f} s, verdict {report.verdict}")
        warm = []
        for _ in range(options.runs):
            began = time.perf_counter()
            run_preflight(project.settings, prepared, PROFILES, where)
            warm.append(time.perf_counter() - began)
        median = statistics.median(warm)
        print(
            f"warm, {len(PROFILES)} profiles: median {median:.1f} s over {len(warm)} runs "
            f"(min {min(warm):.1f}, max {max(warm):.1f}); {median / cold:.2f}x cold; "
            f"budget {BUDGET_S:.0f} s: {'met' if max(warm) <= BUDGET_S else 'NOT met'}"
        )
        shutil.rmtree(venvs, ignore_errors=True)


if __name__ == "__main__":
    main()
