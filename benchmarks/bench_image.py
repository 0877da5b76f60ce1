"""Image stage timings against a plain `docker build` of the same Dockerfile, in one run.

    python benchmarks/bench_image.py [--repeat N]

Sets up what the tests use (arm64 Debian base with the real SGLang 0.5.12 package, pushed to
a loopback registry; a real release repository; a patch to tokenizer_manager.py), then
times, N times each, taking the median:

- reference: `docker build --no-cache` (BuildKit) of sparkbuild's overlay Dockerfile and the
  same overlay context, FROM the same pinned base;
- `sparkbuild build --no-cache`: the whole overlay build (source preparation, base digest,
  context, BuildKit, labels, lock);
- `sparkbuild build` again: the no-op rebuild, found up to date by its inputs digest.

Prints both ratios to the reference. Needs `sudo scripts/setup-host.sh` first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.cache import shared_test_cache  # noqa: E402
from tests.support.docker_env import (  # noqa: E402
    BOOKWORM_PYTHON_SITE,
    docker_client,
    push_arm64_base,
    remove_images,
    start_registry,
)
from tests.support.image_project import (  # noqa: E402
    build_json,
    make_patch_file,
    sparkbuild,
    write_spec,
)
from tests.support.sglang_releases import extract_wheel_package, sglang_release_repo  # noqa: E402

from sparkbuild.image import base_image, builder, context  # noqa: E402
from sparkbuild.settings import Settings  # noqa: E402
from sparkbuild.source import prepare_source  # noqa: E402
from sparkbuild.spec import load_builds  # noqa: E402

VERSION = "0.5.12"
BUILD = "bench-sglang"
TOKENIZER = "python/sglang/srt/managers/tokenizer_manager.py"
FIX_OLD = "server_args.speculative_eagle_topk * server_args.speculative_num_steps,"
FIX_NEW = "(server_args.speculative_eagle_topk or 1) * (server_args.speculative_num_steps or 0),"


def timed(action: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.monotonic()
        action()
        samples.append(time.monotonic() - started)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cache = shared_test_cache()
    client = docker_client()
    images: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-image-") as tmp:
        work = Path(tmp)
        package = extract_wheel_package(VERSION, cache)
        repo = sglang_release_repo(cache, [VERSION])
        with start_registry(work / "registry") as reg:
            base = push_arm64_base(
                reg,
                "bench/sglang",
                tag=f"v{VERSION}",
                extras={BOOKWORM_PYTHON_SITE: package},
                work_dir=work,
            )
            images.append(base)
            project = work / "project"
            patch = project / "patches" / "fix.patch"
            make_patch_file(repo, f"v{VERSION}", {TOKENIZER: (FIX_OLD, FIX_NEW)}, patch)
            write_spec(
                project,
                "sglang",
                {
                    "repo": str(repo),
                    "package_dir": "python/sglang",
                    "base_image": base,
                    "tags": ["bench/{engine}:{version}-{tree_short}"],
                    "builds": {
                        BUILD: {"ref": f"v{VERSION}", "patches": [{"file": "patches/fix.patch"}]}
                    },
                },
            )
            bench_cache = work / "cache"
            quiet = ("--quiet", "build", BUILD, "--json")

            def overlay() -> None:
                images.append(
                    build_json(sparkbuild(project, bench_cache, *quiet, "--no-cache"))["image_id"]
                )

            def noop() -> None:
                assert build_json(sparkbuild(project, bench_cache, *quiet))["skipped"]

            settings = Settings(project_dir=project, cache_dir=bench_cache)
            build = load_builds(settings)[BUILD]
            prepared = prepare_source(build, settings)
            ctx = work / "context"
            context.write_overlay_context(prepared, ctx, None)
            pinned = base_image.resolve(client, base, "linux/arm64", where="bench").pinned
            docker = builder.find_client()
            dockerfile = context.find_dockerfile(build, settings).path
            plain_cmd = [
                docker.path,
                *(["buildx", "build", "--load"] if docker.kind == "buildx" else ["build"]),
                "--no-cache",
                "--quiet",
                "--platform",
                "linux/arm64",
                "--build-arg",
                f"BASE_IMAGE={pinned}",
                "-f",
                str(dockerfile),
                str(ctx),
            ]
            env = {**os.environ, "DOCKER_BUILDKIT": "1"}

            def plain() -> None:
                out = subprocess.run(
                    plain_cmd, env=env, capture_output=True, text=True, check=True
                ).stdout
                images.append(out.strip().splitlines()[-1])

            overlay()  # warm: base pulled into BuildKit, mirror cloned
            reference = timed(plain, args.repeat)
            overlay_s = timed(overlay, args.repeat)
            noop_s = timed(noop, args.repeat)
        remove_images(client, images)
    print(f"plain docker build --no-cache (reference): {reference:7.2f} s")
    print(
        f"sparkbuild overlay build --no-cache:       {overlay_s:7.2f} s  "
        f"ratio {overlay_s / reference:.2f}x"
    )
    print(
        f"sparkbuild no-op rebuild (up to date):     {noop_s:7.2f} s  "
        f"ratio {noop_s / reference:.2f}x"
    )


if __name__ == "__main__":
    main()
