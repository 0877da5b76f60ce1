"""A project whose images.lock has every section the report shows, made by the stages' own
writers, in a git repository with two revisions of the lock (two published images).

How each part is made, and why:

- **source**: the real ``sparkbuild lock`` over a local upstream with tags and PR refs
  (:func:`tests.support.gitrepos.make_upstream`); revision 1 locks ``pkg-new`` at v1.0.0
  with PRs #101 and #103, revision 2 moves it to v1.1.0 (where #101 is upstream) and adds
  PR #104, as a bump does.
- **image** and **requirements**: the lock models the image and requirements stages write
  (``ImageSection``, ``LockedWheel``), since building an arm64 image takes minutes.
- **preflight**: preflight's own recorder with a ``PreflightReport`` (as the publication tests do).
- **smoke**: smoke's own recorder with ``SmokeResult`` objects: a verified image run, and a
  URL run whose address carries a token (recorded unverified), instead of booting vLLM.
- **bench**: a ``BenchReport`` recorded by bench's own recorder, and its JSON written where
  ``--bench-runs`` reads it.
- **publish**: ``publish.record.after_push`` applied under the lock handle as the publish
  stage applies it (pushing needs an image and a registry).

Engine strings and labels carry markup, as a hostile engine or spec could send.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sparkbuild import lockfile
from sparkbuild.bench import report as bench_report
from sparkbuild.bench.results import (
    BenchReport,
    CellResult,
    EngineInfo,
    HarnessInfo,
    HostInfo,
    PromptInfo,
    RunFigures,
    TargetInfo,
    cell_stats,
)
from sparkbuild.bench.sweep import Sweep
from sparkbuild.checks import CheckResult
from sparkbuild.publish.record import after_push
from sparkbuild.smoke import record as smoke_lock
from sparkbuild.smoke.runner import SmokeResult
from tests.support.cli import CliResult, run_cli
from tests.support.gitrepos import Upstream, git, make_patch
from tests.support.preflight_lock import record_preflight

ROOT = Path(__file__).resolve().parents[2]
HOSTILE_ENGINE = '0.32.0<script>document.title="pwned"</script>'
HOSTILE_LABEL = "<img src=x onerror=\"document.title='pwned'\">cpu run"
HOSTILE_TAG = "sparkbuild/pkg:<b>bold</b>"
SECRET = "hunter2-secret-token"
IMAGE_1 = "sha256:" + "1" * 64
IMAGE_2 = "sha256:" + "2" * 64
OLD_IMAGE = "sha256:" + "0" * 64
DIGEST_1 = "sha256:" + "d1" * 32
DIGEST_2 = "sha256:" + "d2" * 32
BASE_DIGEST = "sha256:" + "ba" * 32
REPOSITORY = "ghcr.io/example/pkg"
PROFILE = "cpu-reference"
DECODE_CLIENT = 123.4  # the c=1 cell's per-request decode rate, shown on the build page
ACCEPT_LEN = 2.24

SPEC = """\
engine: sglang
repo: REPO
package_dir: python/pkg
patches:
  - {file: patches/pkg/alpha.patch}
builds:
  pkg-old:
    ref: v1.0.0
    prs: [{number: 103}]
    smoke: [cpu-reference]
  pkg-new:
    ref: REF
    prs: PRS
    smoke: [cpu-reference]
"""

CLAIMS = """\
source: "A forum post <script>alert(1)</script>"
date: "2026-06"
setups:
  S1:
    engine: vllm
    model: tiny-llama
    flags: [--dtype, bfloat16]
    profile: cpu-reference
    harness: llama-benchy 0.4.0
    hardware: 1x DGX Spark (GB10)
claims:
  - setup: S1
    cell: {pp: 64, tg: 32, depth: 0, concurrency: 1}
    decode_tps_request: 150.0
"""


@dataclass(frozen=True)
class ReportProject:
    root: Path
    cache: Path
    runs: Path  # where the bench run's JSON is

    @property
    def lock_path(self) -> Path:
        return self.root / "images.lock"

    def run(self, *args: str) -> CliResult:
        return run_cli("--project", str(self.root), "--cache-dir", str(self.cache), "--quiet",
                       *args)  # fmt: skip


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _commit(root: Path, message: str) -> None:
    git(root, "add", "-A")
    stamp = _now()
    git(root, "commit", "-q", "-m", message,
        env={"GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp})  # fmt: skip


def _spec(project: ReportProject, url: str, ref: str, prs: list[int]) -> None:
    text = SPEC.replace("REPO", url).replace("REF", ref)
    text = text.replace("PRS", "[" + ", ".join(f"{{number: {n}}}" for n in prs) + "]")
    (project.root / "builds" / "pkg.yaml").write_text(text)


def _lock(project: ReportProject, *builds: str) -> None:
    result = project.run("lock", *builds)
    assert result.exit_code == 0, result.output


def _image(project: ReportProject, build: str, image_id: str, tree: str | None = None) -> None:
    entry = lockfile.read_entry(project.lock_path, build)
    assert entry.source is not None
    section = lockfile.ImageSection(
        mode="overlay",
        base_image="127.0.0.1:5000/sglang-base:v0.5.12",
        base_digest=BASE_DIGEST,
        platform="linux/arm64",
        tree=tree or entry.source.tree,
        inputs_digest="sha256:" + "1a" * 32,
        image_id=image_id,
        repo_digest=None,
        tags=[f"sparkbuild/{build}:{image_id[7:15]}", HOSTILE_TAG],
    )
    section.device_code = _device_code(image_id)
    lockfile.set_section(project.lock_path, build, section)


def _device_code(image_id: str) -> dict[str, object]:
    """The audit's lock record (image/audit_record.py), one library named as an attacker
    would: the report escapes it."""
    hopper = {"path": "/site/sgl_kernel/_C.abi3.so", "verdict": "none", "loaded": True}
    return {
        "format": 1,
        "image_id": image_id,
        "target": "sm_121",
        "counts": {"native": 1, "ptx": 0, "none": 1, "jit": 0},
        "roots": ["sglang"],
        "nvcc": False,
        "libraries": [
            {
                "name": "sglang-kernel",
                "version": "0.4.2.post2",
                "kind": "python",
                "verdict": "none",
                "loaded": True,
                "sass": ["sm_100a", "sm_90a"],
                "ptx": [],
                "compiles": None,
                "files": [hopper],
                "native_files": 0,
            },
            {
                "name": "<script>alert(1)</script>",
                "version": None,
                "kind": "file",
                "verdict": "native",
                "loaded": False,
                "sass": ["sm_121a"],
                "ptx": [],
                "compiles": None,
                "files": [],
                "native_files": 1,
            },
        ],
        "warnings": [],
    }


def _wheels(project: ReportProject, build: str, version: str) -> None:
    wheel = lockfile.LockedWheel(
        requirement=f"demo-kernels=={version}",
        name="demo-kernels",
        version=version,
        filename=f"demo_kernels-{version}-py3-none-any.whl",
        sha256=("ab" if version == "1.0" else "cd") * 32,
    )
    lockfile.set_section(project.lock_path, build, [wheel])


def _smoke(project: ReportProject, build: str, image_id: str) -> None:
    checks = [
        CheckResult("boot", "pass", "ready", value=31.0),
        CheckResult("accept_len", "pass", "drafts accepted", value=ACCEPT_LEN),
        CheckResult("nan", "pass", "no NaN"),
    ]
    verified = SmokeResult(
        verdict="pass", profile=PROFILE, engine="vllm", model="tiny-llama", target_kind="image",
        target=f"sparkbuild/{build}", boot_seconds=31.0, accept_len=ACCEPT_LEN, checks=checks,
        image_id=image_id, engine_version=HOSTILE_ENGINE, nan_signal="VLLM_COMPUTE_NANS_IN_LOGITS",
    )  # fmt: skip
    smoke_lock.record(project.lock_path, build, verified)
    by_url = SmokeResult(
        verdict="pass", profile="cpu-url", engine="vllm", model="tiny-llama", target_kind="url",
        target=f"https://user:{SECRET}@engine.example:8000", boot_seconds=None, accept_len=2.0,
        checks=checks[1:], engine_version="0.32.0",
    )  # fmt: skip
    smoke_lock.record(project.lock_path, build, by_url)


def bench_run(image_id: str) -> BenchReport:
    """A two-cell sweep (c=1, c=4) as bench reports it; the c=4 cell had a burst run."""

    def run(decode: float | None, engine: float, burst: str | None = None) -> RunFigures:
        return RunFigures(
            ttft_s=0.21, prefill_tps=300.0, decode_tps_request=decode,
            decode_tps_aggregate=None if decode is None else decode * 0.98, output_tps=90.0,
            seconds=1.2, requests=1, errors=0, prompt_tokens=64, completion_tokens=32,
            accept_len=ACCEPT_LEN, decode_tps_engine=engine, burst=burst,
            client_engine_ratio=None if decode is None else decode / engine,
        )  # fmt: skip

    def cell(concurrency: int, runs: list[RunFigures], flags: list[str]) -> CellResult:
        stats = cell_stats(runs)
        return CellResult(
            pp=64, tg=32, depth=0, concurrency=concurrency, ttft_s=stats["ttft_s"],
            prefill_tps=stats["prefill_tps"], decode_tps_request=stats["decode_tps_request"],
            decode_tps_aggregate=stats["decode_tps_aggregate"], output_tps=stats["output_tps"],
            decode_tps_engine=stats["decode_tps_engine"], ttft_p50_s=0.21,
            burst_runs=sum(1 for r in runs if r.burst), flags=flags, accept_len=ACCEPT_LEN,
            prompt_tokens_target=64, prompt_tokens=64, completion_tokens=32,
            requests=len(runs) * concurrency, errors=0, runs=runs,
        )  # fmt: skip

    burst = "tokens arrived in one flush"
    cells = [
        cell(1, [run(DECODE_CLIENT, 125.0), run(DECODE_CLIENT, 124.0)], []),
        cell(4, [run(88.0, 90.0), run(None, 91.0, burst)],
             [f"run 2: burst ({burst}); client decode rate not reported"]),
    ]  # fmt: skip
    return BenchReport(
        created=_now(), label=HOSTILE_LABEL, profile=PROFILE,
        harness=HarnessInfo(version="1", sparkbuild="0.1.0", http_client="httpx"),
        host=HostInfo(hostname="ci", platform="linux", machine="x86_64", cpus=2, python="3.11"),
        target=TargetInfo(kind="image", value="sparkbuild/pkg-new", image_id=image_id),
        engine=EngineInfo(name="vllm", version="0.32.0", model="/models/tiny-llama",
                          served_model="tiny-llama", args=["--dtype", "bfloat16"]),
        sweep=Sweep(pp=[64], tg=[32], depth=[0], concurrency=[1, 4], runs=2),
        prompts=PromptInfo(recipe="prose-v1", seed=0, calibration="tokenize",
                           fingerprint="f" * 64, exact=True),
        complete=True, cells=cells,
    )  # fmt: skip


def _bench(project: ReportProject, build: str, image_id: str) -> None:
    report = bench_run(image_id)
    bench_report.record(project.lock_path, build, report)
    project.runs.mkdir(parents=True, exist_ok=True)
    path = project.runs / f"{build}.json"
    path.write_text(json.dumps(report.model_dump(mode="json")), encoding="utf-8")


def _publish(project: ReportProject, build: str, image_id: str, digest: str) -> None:
    entry = lockfile.read_entry(project.lock_path, build)
    verdicts = {PROFILE: "pass"}
    publication = lockfile.Publication(
        digest=digest, image_id=image_id, tag=f"1.x-{image_id[7:14]}", verified=True,
        smoke=verdicts,
    )  # fmt: skip

    def change(entry: lockfile.BuildEntry) -> None:
        records = entry.publish or {}
        before = records.get(REPOSITORY)
        record = after_push(before, publication, ["latest"])
        entry.publish = {**records, REPOSITORY: record}

    assert entry.image is not None and entry.image.image_id == image_id
    lockfile.update_entry(project.lock_path, build, change)


def make_report_project(tmp_path: Path, upstream: Upstream) -> ReportProject:
    """The project after two published images of ``pkg-new`` (see the module docstring)."""
    root = tmp_path / "project"
    project = ReportProject(root, tmp_path / "cache", tmp_path / "bench-runs")
    (root / "builds").mkdir(parents=True)
    (root / "smoke").mkdir()
    (root / "claims").mkdir()
    shutil.copy(ROOT / "smoke" / f"{PROFILE}.yaml", root / "smoke")
    (root / "claims" / "forum.yaml").write_text(CLAIMS)
    edit = {"python/pkg/gamma.py": ("gamma line 9\n", "gamma line 9 (ours)\n")}
    header = "sparkbuild patch: keep gamma 9 <em>stable</em> on the Spark\n\nwhen: >=1.0"
    patch = make_patch(upstream.work, "v1.0.0", edit, header=header)
    (root / "patches" / "pkg").mkdir(parents=True)
    (root / "patches" / "pkg" / "alpha.patch").write_text(patch)
    git(root, "init", "-q", "-b", "main")

    # Revision 1: pkg-new at v1.0.0 with #101 and #103, built, checked and published.
    _spec(project, upstream.url, "v1.0.0", [101, 103])
    _lock(project)
    _image(project, "pkg-old", OLD_IMAGE, tree="f" * 40)  # built before the source moved
    _image(project, "pkg-new", IMAGE_1)
    _wheels(project, "pkg-new", "1.0")
    record_preflight(project.lock_path, "pkg-new", PROFILE)
    _smoke(project, "pkg-new", IMAGE_1)
    _publish(project, "pkg-new", IMAGE_1, DIGEST_1)
    _commit(root, "pkg-new 1.0.0 published")

    # Revision 2: bumped to v1.1.0 (#101 is upstream there) with #104, a new image.
    _spec(project, upstream.url, "v1.1.0", [101, 103, 104])
    _lock(project, "pkg-new")
    _image(project, "pkg-new", IMAGE_2)
    _wheels(project, "pkg-new", "1.1")
    record_preflight(project.lock_path, "pkg-new", PROFILE)
    _smoke(project, "pkg-new", IMAGE_2)
    _bench(project, "pkg-new", IMAGE_2)
    _publish(project, "pkg-new", IMAGE_2, DIGEST_2)
    _commit(root, "pkg-new 1.1.0 published")
    return project
