"""The typed lock: one schema for load and `lock --check`, byte-identical round trips, and a
handle that writes each build's entry once, on real files."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import BaseModel

from sparkbuild import lockfile
from sparkbuild.bench.record import bench_record
from sparkbuild.bench.results import BenchReport, NodeInfo
from sparkbuild.checks import CheckResult
from sparkbuild.engines.cluster_target import NodeImage
from sparkbuild.engines.compile_cache import CompilePhase, Usage
from sparkbuild.engines.host_facts import NodeFacts
from sparkbuild.engines.host_watch import HostRun
from sparkbuild.engines.profiles import Parallel
from sparkbuild.errors import LockError, NoPinnedImageError
from sparkbuild.preflight.record import preflight_run
from sparkbuild.preflight.report import PreflightReport, ProfileResult
from sparkbuild.publish.record import after_push
from sparkbuild.settings import Settings
from sparkbuild.smoke.deep.evidence import RequestEvidence
from sparkbuild.smoke.record import smoke_record
from sparkbuild.smoke.runner import ClusterRun, SmokeResult
from sparkbuild.source.items import ItemResult, PreparedSource
from sparkbuild.source.record import locked_step, source_section
from sparkbuild.spec import Build, load_builds
from tests.test_bench_claims import report as bench_report

COMMIT = "a" * 40
IMAGE = "sha256:" + "b" * 64

# A lock as the stages write it: every section, with keys of their own beside the typed ones.
FULL = textwrap.dedent(
    f"""\
    builds:
      b1:
        bench:
          {IMAGE}:
            cpu:
              cells:
              - accept_len: 1.5
                pp: 128
              label: cpu
        image:
          cuda_code:
            sm_121: true
          image_id: {IMAGE}
          inputs_digest: sha256:{"c" * 64}
          repo_digest: null
          tags:
          - local/b1:tree
          tree: {COMMIT}
        preflight:
          {COMMIT}+sha256:{"d" * 64}:
            image_id: {IMAGE}
            profiles:
              cpu:
                checks:
                  config: pass
                verdict: pass
            where: image
        publish:
          reg.example/b1:
            aliases:
            - latest
            digest: sha256:{"e" * 64}
            history:
            - digest: sha256:{"e" * 64}
              rolled_back: true
              smoke:
                cpu: pass
              verified: true
            verified: true
        requirements:
        - filename: x-1.0-py3-none-any.whl
          name: x
          requirement: x==1.0
          sha256: {"f" * 64}
          version: '1.0'
        smoke:
          {IMAGE}:
            cpu:
              accept_len: 2.5
              verdict: pass
              verified: true
        source:
          commit: {COMMIT}
          engine: sglang
          patches: []
          prs:
          - commits: []
            head: {COMMIT}
            number: 7
            status: applied
          ref: v1.0.0
          repo: https://example.invalid/x.git
          spec_digest: sha256:{"0" * 64}
          tree: {COMMIT}
          version: 1.0.0
    schema: 1
    """
)


@pytest.fixture
def full(tmp_path: Path) -> Path:
    path = tmp_path / "images.lock"
    path.write_text(lockfile.HEADER + FULL)
    return path


def test_every_section_loads_typed_and_dumps_byte_identical(full: Path) -> None:
    lock = lockfile.load(full)
    entry = lock.entry("b1")
    assert entry is not None and entry.source is not None and entry.image is not None
    assert entry.source.pr_heads() == {7: COMMIT}
    assert entry.image.image_id == IMAGE
    assert entry.smoke is not None and entry.smoke[IMAGE]["cpu"].verified is True
    assert entry.publish is not None
    assert [p.rolled_back for p in entry.publish["reg.example/b1"].published()] == [True]
    assert entry.requirements is not None and entry.requirements[0].version == "1.0"
    assert lockfile.dumps(lock) == full.read_text()
    assert lockfile.schema_problems(full) == []


def test_a_handle_writes_each_build_once_and_keeps_other_writers(
    full: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = lockfile.LockHandle.open(full)
    # Another command records a verdict meanwhile: the handle's write must keep it.
    lockfile.set_section(full, "b2", lockfile.ImageSection(image_id=IMAGE))
    handle.set_section("b1", handle.entry("b1").source)  # type: ignore[union-attr,arg-type]
    handle.set_section("b1", lockfile.ImageSection(image_id=IMAGE, tags=["t"]))
    writes: list[Path] = []
    real = lockfile.write_atomic

    def counted(path: Path, text: str) -> None:
        writes.append(path)
        real(path, text)

    monkeypatch.setattr(lockfile, "write_atomic", counted)
    handle.write()
    assert writes == [full]
    written = lockfile.load(full)
    assert written.builds["b2"].image is not None
    image = written.builds["b1"].image
    assert image is not None and image.tags == ["t"] and image.inputs_digest is None
    assert written.builds["b1"].smoke is not None  # the sections not queued stay


def test_a_change_that_raises_writes_nothing(full: Path) -> None:
    before = full.read_bytes()
    handle = lockfile.LockHandle.open(full)
    handle.set_section("b1", lockfile.ImageSection(image_id="sha256:" + "9" * 64))

    def refuse(entry: lockfile.BuildEntry) -> None:
        raise LockError("the image changed meanwhile")

    handle.change("b1", refuse)
    with pytest.raises(LockError):
        handle.write()
    assert full.read_bytes() == before


def test_typed_fields_are_not_coerced(full: Path) -> None:
    # A hand-edited `verified: 1` must not count as a verified run.
    text = full.read_text()
    smoke = "verdict: pass\n          verified: true\n"
    assert smoke in text
    full.write_text(text.replace(smoke, smoke.replace("true", "1")))
    with pytest.raises(LockError) as raised:
        lockfile.load(full)
    assert "smoke.sha256:" in raised.value.message and "verified" in raised.value.message
    assert "Input should be a valid boolean" in raised.value.message


@pytest.mark.parametrize(
    "damage, problem",
    [
        (("      engine: sglang\n", ""), "`builds.b1.source.engine`: Field required"),
        (("        status: applied\n", ""), "`builds.b1.source.prs.0.status`: Field required"),
        ((f"image_id: {IMAGE}\n      inputs", "image_id: local:1\n      inputs"),
         "`builds.b1.image.image_id`: String should match pattern"),
        (("schema: 1\n", "schema: 1\nextra: x\n"), "`extra`: Extra inputs are not permitted"),
        (("schema: 1\n", ""), "no `schema:` field"),
    ],
)  # fmt: skip
def test_lock_check_holds_a_complete_shape(
    full: Path, damage: tuple[str, str], problem: str
) -> None:
    text = full.read_text()
    assert damage[0] in text
    full.write_text(text.replace(*damage))
    lockfile.load(full)  # every command still reads it
    problems = lockfile.schema_problems(full)
    assert len(problems) == 1 and problems[0].startswith("images.lock: ")
    assert problem in problems[0]


TIMES = "      repo_digest: null\n"


def test_build_times_are_optional_and_load_when_utc(full: Path) -> None:
    assert "started" not in full.read_text()  # a lock older than the build times
    assert lockfile.schema_problems(full) == []
    text = full.read_text()
    times = "      started: '2026-11-25T18:01:02+00:00'\n      finished: '2026-11-25T18:07:09Z'\n"
    full.write_text(text.replace(TIMES, TIMES + times))
    image = lockfile.read_entry(full, "b1").image
    assert image is not None and image.build_times() is not None
    assert lockfile.schema_problems(full) == []


@pytest.mark.parametrize(
    "started, finished, problem",
    [
        ("2026-11-25T18:01:02", "2026-11-25T18:07:09Z", "not a UTC time"),
        ("2026-11-25T19:01:02+01:00", "2026-11-25T18:07:09Z", "not a UTC time"),
        ("yesterday", "2026-11-25T18:07:09Z", "not an ISO 8601 date and time"),
        ("2026-11-25T18:07:09Z", "2026-11-25T18:01:02Z", "is before started"),
    ],
)
def test_build_times_off_utc_or_out_of_order_are_refused_by_name(
    full: Path, started: str, finished: str, problem: str
) -> None:
    text = full.read_text()
    assert TIMES in text
    times = f"      started: '{started}'\n      finished: '{finished}'\n"
    full.write_text(text.replace(TIMES, TIMES + times))
    with pytest.raises(LockError) as raised:
        lockfile.load(full)
    assert "builds.b1.image" in raised.value.message and problem in raised.value.message


# --- the schema is the models: every record from its stage's result ----------------------

SPEC = """\
engine: sglang
repo: https://example.invalid/sglang.git
package_dir: python/sglang
prs:
  - {number: 7, note: a note the digest does not cover}
  - {number: 9, when: ">=1.0,<2"}
patches:
  - {file: patches/fix.patch, when: ">=1.0"}
builds:
  b1:
    ref: v1.2.0
    prs: [{number: 11}]
    requirements: [{req: "transformers==5.8.1", mode: source}]
    mode: source
  b2:
    ref: v1.2.0
"""


def _builds(tmp_path: Path) -> dict[str, Build]:
    (tmp_path / "builds").mkdir()
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "fix.patch").write_text("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    (tmp_path / "builds" / "x.yaml").write_text(SPEC)
    return load_builds(Settings(project_dir=tmp_path, cache_dir=tmp_path / "cache"))


def test_spec_digests_are_the_ones_older_sparkbuilds_locked(tmp_path: Path) -> None:
    # Computed by sparkbuild before the spec's PR became one model (PRModel and PR merged):
    # every lock's spec_digest depends on this payload staying byte-identical.
    builds = _builds(tmp_path)
    assert builds["b1"].spec_digest() == (
        "sha256:6ebd7d6234140f1482b13902c2fb7ae4f784a2485ef9562bff4c909076463fcd"
    )
    assert builds["b2"].spec_digest() == (
        "sha256:2216f1080de21b076a1170be234409a1dfdd02ab2a1d744315d423028e3a8817"
    )


def _prepared(build: Build) -> PreparedSource:
    pr = ItemResult(
        kind="pr", id="#7", status="applied", detail="", files=("a.py",), number=7,
        head=COMMIT, commits=(COMMIT,), diff_sha256="f" * 64,
    )  # fmt: skip
    out = ItemResult(
        kind="pr", id="#9", status="out-of-range", detail="", when=">=1.0,<2", number=9
    )
    patch = ItemResult(
        kind="patch", id="patches/fix.patch", status="upstream", detail="", when=">=1.0",
        file="patches/fix.patch", sha256="e" * 64,
    )  # fmt: skip
    return PreparedSource(build, COMMIT, COMMIT, COMMIT, (pr, out, patch), (), Path("/nowhere"))


def _smoke(kind: str, image_id: str | None, declared: tuple[str, ...] = ()) -> SmokeResult:
    checks = [CheckResult("boot", "pass", "ready", value=1.5), CheckResult("nan", "skip", "-")]
    evidence = [RequestEvidence.of_text("smoke", "p", "text", "length", 4)]
    return SmokeResult(
        verdict="pass", profile="cpu", engine="vllm", model="m", target_kind=kind, target="t",
        boot_seconds=1.5, accept_len=2, checks=checks, image_id=image_id,
        engine_version="0.32.0", nan_signal="off", evidence=evidence, declared=declared,
    )  # fmt: skip


def _preflight(image_id: str | None) -> PreflightReport:
    return PreflightReport(
        build="b1", engine="sglang", version="1.2.0", where="image", tree=COMMIT,
        deps_digest="sha256:" + "d" * 64,
        package_checks=(CheckResult("compile", "pass", "ok"),),
        profiles=(ProfileResult("cpu", (CheckResult("config", "skip", "cuda"),)),),
        image_id=image_id, versions={"torch": "2.9.1", "transformers": None},
    )  # fmt: skip


CLUSTER_ONLY = {"cluster", "topology", "launcher", "nodes"}  # written by cluster runs only
DEEP_ONLY = {"declared"}  # written when the profile declares deep checks
COMPILE_ONLY = {"compile"}  # written by a run with a compile cache (smoke's own boots)
HOSTS = {"hosts"}  # written by runs that read their hosts (not a --url run)
_HOST_RUN = HostRun(
    (NodeFacts("node-0", {"kernel": "6.17.0-1029-nvidia"}, read_at="2026-11-27T00:00:00Z"),)
)


def _on_cluster(result: SmokeResult) -> SmokeResult:
    nodes = tuple(NodeImage(f"node-{i}", "local", IMAGE, IMAGE, i) for i in range(2))
    return replace(
        result, cluster=ClusterRun("pair", Parallel(nodes=2, tp=2), "mp", nodes), host=_HOST_RUN
    )


def _bench_on_cluster() -> BenchReport:
    report = bench_report()
    nodes = [NodeInfo(name=f"node-{i}", endpoint="local", rank=i, image_id=IMAGE)
             for i in range(2)]  # fmt: skip
    target = report.target.model_copy(update={"kind": "cluster", "nodes": nodes})
    update = {"topology": Parallel(nodes=2, tp=2), "target": target,
              "host_facts": dict(_HOST_RUN.to_json())}  # fmt: skip
    return report.model_copy(update=update)


def _fields(model: type[BaseModel]) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


def test_each_record_is_made_from_its_stages_result_with_every_field(tmp_path: Path) -> None:
    build = _builds(tmp_path)["b1"]
    source = source_section(_prepared(build))
    # `steps` only for a build with source steps, so other entries keep their shape.
    assert set(source.to_json()) == _fields(lockfile.SourceSection) - {"steps"}
    step = ItemResult(
        kind="step",
        id="sm121a-prune:CMakeLists.txt",
        status="applied",
        detail="",
        file="CMakeLists.txt",
        step="sm121a-prune",
        step_version=1,
    )
    assert set(locked_step(step).to_json()) == _fields(lockfile.LockedStep)
    assert [set(pr.to_json()) for pr in source.prs] == [_fields(lockfile.LockedPR)] * 2
    assert set(source.patches[0].to_json()) == _fields(lockfile.LockedPatch)
    assert source.spec_digest == build.spec_digest() and source.version == "1.2.0"
    smoke = smoke_record(_smoke("image", IMAGE))
    assert set(smoke.to_json()) == (
        _fields(lockfile.SmokeRecord) - CLUSTER_ONLY - DEEP_ONLY - COMPILE_ONLY - HOSTS
    )
    assert smoke.verified is True and smoke.checks == {"boot": "pass", "nan": "skip"}
    on_cluster = smoke_record(_on_cluster(_smoke("cluster", IMAGE, declared=("lossless",))))
    assert set(on_cluster.to_json()) == _fields(lockfile.SmokeRecord) - COMPILE_ONLY
    before, after = Usage({"engine": (0, 0)}), Usage({"engine": (3, 900)})
    first_boot = CompilePhase("image-" + "a" * 64, True, False, before, after, 12.5, ("x",))
    compiled = smoke_record(replace(_smoke("image", IMAGE), compile=first_boot))
    assert set(compiled.to_json()) == (
        _fields(lockfile.SmokeRecord) - CLUSTER_ONLY - DEEP_ONLY - HOSTS
    )
    assert compiled.compile is not None and compiled.compile.latest is not None
    assert set(compiled.compile.to_json()) == _fields(lockfile.CompileRecord)
    assert set(compiled.compile.latest.to_json()) == _fields(lockfile.CompileBoot)
    assert compiled.compile.latest.compiled == ["engine (+3 files)"]
    assert [set(n.to_json()) for n in on_cluster.nodes] == [_fields(lockfile.NodeRecord)] * 2
    assert on_cluster.verified is True and on_cluster.every_node_ran(IMAGE)
    unverified = smoke_record(_smoke("url", None))
    assert unverified.verified is False and unverified.image_id is None
    run = preflight_run(replace(_preflight(IMAGE), host=_HOST_RUN.nodes[0]))
    assert set(run.to_json()) == _fields(lockfile.PreflightRun)
    assert run.hosts is not None and run.hosts.nodes[0].facts == {"kernel": "6.17.0-1029-nvidia"}
    assert set(run.profiles["cpu"].to_json()) == _fields(lockfile.ProfileVerdict)
    assert run.versions == {"torch": "2.9.1"} and run.profiles["cpu"].verdict == "skip"
    assert "image_id" not in preflight_run(_preflight(None)).to_json()
    bench = bench_record(bench_report())
    assert set(bench.to_json()) == _fields(lockfile.BenchRecord) - {"topology", "nodes"} - HOSTS
    bench_on_cluster = bench_record(_bench_on_cluster())
    assert set(bench_on_cluster.to_json()) == _fields(lockfile.BenchRecord)
    assert [set(c.to_json()) for c in bench.cells] == [_fields(lockfile.BenchCell)] * 2

    path = tmp_path / "images.lock"
    lockfile.set_section(path, "b1", source)
    lockfile.set_section(path, "b1", lockfile.ImageSection(image_id=IMAGE, tree=COMMIT))
    lockfile.record_for_image(path, "b1", "cpu", smoke, tested_id=IMAGE, activity="smoke run")
    lockfile.record_for_image(path, "b1", "url", unverified, tested_id=None, activity="smoke")
    lockfile.record_for_image(path, "b1", "cpu", bench, tested_id=IMAGE, activity="benchmark")
    publication = lockfile.Publication(digest="sha256:" + "e" * 64, image_id=IMAGE, tag="t",
                                       verified=True, smoke={"cpu": "pass"})  # fmt: skip
    publish = after_push(None, publication, ["latest"])
    # `signed` only for a signed publication, so unsigned entries keep their shape.
    assert set(publish.to_json()) == _fields(lockfile.PublishRecord) - {"signed"}
    publication.signed = lockfile.SignedRecord(
        key="sha256:" + "1" * 64, signature="sha256:" + "2" * 64, referrers="tag",
        attestations={"sbom": "sha256:" + "3" * 64}, sbom_packages=3,
    )  # fmt: skip
    assert set(publication.signed.to_json()) == _fields(lockfile.SignedRecord)
    publish = after_push(None, publication, ["latest"])
    assert set(publish.to_json()) == _fields(lockfile.PublishRecord)

    def add(entry: lockfile.BuildEntry) -> None:
        entry.preflight = {"k": run}
        entry.publish = {"reg.example/b1": publish}

    lockfile.update_entry(path, "b1", add)
    text = path.read_text()
    assert "accept_len: 2\n" in text  # a measured 2 stays 2, not 2.0
    assert lockfile.dumps(lockfile.load(path)) == text
    assert lockfile.schema_problems(path) == []


def test_a_key_no_sparkbuild_writes_is_refused_with_its_line(full: Path) -> None:
    text = full.read_text()
    smoke = "verdict: pass\n          verified: true\n"
    full.write_text(text.replace(smoke, smoke + "          racks: 4\n"))
    line = full.read_text().splitlines().index("          racks: 4") + 1
    with pytest.raises(LockError) as raised:
        lockfile.load(full)
    assert f"{full}:{line}: unknown field 'builds.b1.smoke." in raised.value.message
    assert ".cpu.racks'" in raised.value.message


def test_one_pinned_image_for_recording_and_publishing(tmp_path: Path) -> None:
    path = tmp_path / "images.lock"
    with pytest.raises(NoPinnedImageError) as nothing:
        lockfile.pinned_image(None, "b1", path)
    assert (
        nothing.value.message
        == "build 'b1' has no image in images.lock; nothing to record the result for"
    )
    entry = lockfile.BuildEntry(image=lockfile.ImageSection(image_id=IMAGE))
    assert lockfile.pinned_image(entry, "b1", path).image_id == IMAGE
    with pytest.raises(NoPinnedImageError) as no_tree:  # publishing names tags after the tree
        lockfile.pinned_image(entry, "b1", path, "publish")
    assert no_tree.value.message == "b1: images.lock pins no image for it; nothing to publish"
    assert no_tree.value.hint is not None and "--record b1" in no_tree.value.hint
    entry.image = lockfile.ImageSection(image_id=IMAGE, tree=COMMIT)
    assert lockfile.pinned_image(entry, "b1", path, "publish").tree == COMMIT


_WRITER = """
import sys
from pathlib import Path
from sparkbuild import lockfile
path, name = Path(sys.argv[1]), sys.argv[2]
for i in range(8):
    lockfile.set_section(path, f"{name}-{i}", lockfile.ImageSection(image_id=sys.argv[3]))
"""


def test_concurrent_writers_keep_every_entry_and_leave_no_lock_file(tmp_path: Path) -> None:
    """Four processes record into one lock at once: every entry lands (the writers take
    turns), and the project gets no ``images.lock.lock`` to ignore in git."""
    path = tmp_path / "images.lock"
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), f"w{n}", IMAGE])
        for n in range(4)
    ]
    assert [w.wait(timeout=120) for w in writers] == [0, 0, 0, 0]
    assert set(lockfile.load(path).builds) == {f"w{n}-{i}" for n in range(4) for i in range(8)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images.lock"]
