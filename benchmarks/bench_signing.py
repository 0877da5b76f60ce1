"""Signing and attaching against the push itself, in one run.

    python benchmarks/bench_signing.py [--repeat N]

Sets up what tests/test_publish_signing.py uses (the arm64 test image built by the image
stage, a loopback registry with htpasswd auth, a key pair from `sparkbuild keys generate`),
then publishes the image N times each, to a new registry every time (so every run uploads
every layer), taking the median:

- reference: `sparkbuild publish` unsigned (the gates, the push through the docker daemon,
  reading the manifest back, the lock);
- `sparkbuild publish --sign-key`: the same, plus the SBOM read from the image, the three
  signed attestations and the signature, read back and verified.

Prints the ratio of the signed publication to the unsigned one (the goal: at most 1.2x), and
the time signing and attaching add. The rounds alternate, so both see the same host load.
The test image is small (a Debian base, about 100 MB): the push of a 20 GB engine image
takes far longer, while signing grows only with the number of packages, so on a real image
the ratio is smaller. ``--profile FILE`` also profiles one more signed publication
(cProfile, in this process) and prints where its time went. Needs `sudo
scripts/setup-host.sh` first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.docker_env import start_registry  # noqa: E402
from tests.support.preflight_lock import record_preflight  # noqa: E402
from tests.support.publish_env import (  # noqa: E402
    BUILD,
    PROFILE,
    PublishEnv,
    publish_env,
    record_smoke,
    run_publish_cli,
)

PASSPHRASE = "bench-passphrase-not-a-secret"


def _publish(env: PublishEnv, name: str, *extra: str) -> float:
    """One publication to a registry of its own: every layer is uploaded, none mounted."""
    lock = env.lock_copy(name)
    record_smoke(lock, BUILD, PROFILE)
    record_preflight(lock, BUILD, PROFILE)
    with start_registry(env.work / f"registry-{name}", auth=True) as registry:
        assert registry.auth is not None
        user, password = registry.auth
        started = time.perf_counter()
        result = run_publish_cli(
            env.project,
            "--lock-file",
            str(lock),
            "publish",
            BUILD,
            "--registry",
            registry.address,
            "--no-alias",
            *extra,
            env={
                "SPARKBUILD_REGISTRY_USER": user,
                "SPARKBUILD_REGISTRY_PASSWORD": password,
                "SPARKBUILD_SIGNING_PASSWORD": PASSPHRASE,
            },
            docker_config=env.empty_docker_config,
        )
        elapsed = time.perf_counter() - started
    if result.exit_code != 0:
        raise SystemExit(f"publish failed:\n{result.stdout}{result.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", type=Path, help="profile one more signed publication")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="bench-signing-") as work,
        publish_env(Path(work), "sparkbuild-tests/bench-signing-{build}") as env,
    ):
        keys = run_publish_cli(
            env.project,
            "keys",
            "generate",
            "--output-prefix",
            str(env.work / "cosign"),
            env={"SPARKBUILD_SIGNING_PASSWORD": PASSPHRASE},
        )
        if keys.exit_code != 0:
            raise SystemExit(keys.stderr)
        sign = ("--sign-key", str(env.work / "cosign.key"))
        unsigned, signed = [], []
        for run in range(args.repeat):  # interleaved: both see the same host load
            unsigned.append(_publish(env, f"plain{run}"))
            signed.append(_publish(env, f"signed{run}", *sign))
        if args.profile:
            _profiled(env, args.profile, sign)
    reference, total = statistics.median(unsigned), statistics.median(signed)
    added = total - reference
    ratios = [s / u for s, u in zip(signed, unsigned, strict=True)]
    print(f"publish, unsigned (reference): {reference:6.2f} s  (runs: {_listed(unsigned)})")
    print(f"publish --sign-key:            {total:6.2f} s  (runs: {_listed(signed)})")
    print(f"signing and attaching added:   {added:6.2f} s")
    print(
        f"signed / unsigned:             {total / reference:6.2f}x (median; each round: "
        f"{_listed(ratios, 'x')}; the goal is at most 1.20x)"
    )


def _listed(values: list[float], unit: str = " s") -> str:
    return ", ".join(f"{value:.2f}{unit}" for value in values)


def _profiled(env: PublishEnv, path: Path, sign: tuple[str, ...]) -> None:
    """One more signed publication under cProfile: sparkbuild's own calls by cumulative time."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        _publish(env, "profiled", *sign)
    finally:
        profiler.disable()
    profiler.dump_stats(path)
    stats = pstats.Stats(str(path))
    stats.sort_stats("cumulative").print_stats(r"sparkbuild/(attest|publish|registry)", 30)


if __name__ == "__main__":
    main()
