"""The sm121a-prune source step on our own CMake project shaped like sgl-kernel's
(tests/data/spark_kernel): what it changes and keeps, anchor drift, idempotence, and the step
as a `when`-ranged spec item through patches, prepare, lock, --locked, lock --check and bump,
on a real git upstream whose kernel tree moves (as 0.5.17's did) and then drifts."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sparkbuild.errors import AnchorDriftError
from sparkbuild.requirements import lapsed_pins
from sparkbuild.settings import Settings
from sparkbuild.source import gencodes
from sparkbuild.spec import lapsed_note, load_builds
from tests.support.cli import run_cli
from tests.support.gitrepos import Upstream, commit_all, git
from tests.support.sglang_releases import ALL_RELEASES
from tests.support.source_project import SourceProject

DATA = Path(__file__).parent / "data" / "spark_kernel"
CMAKE = (DATA / "CMakeLists.txt").read_text()
PROJECT = Path(__file__).resolve().parents[1]


def prune(text: str) -> gencodes.PruneResult:
    return gencodes.prune_to_sm121a(text, "sgl-kernel/CMakeLists.txt")


def live(text: str) -> str:
    """The text without its comments (what CMake reads)."""
    return "\n".join(line.split("#", 1)[0].rstrip() for line in text.splitlines())


# -- the edit itself ---------------------------------------------------------------------


def test_every_gencode_list_builds_sm_121a_only_and_the_targets_go() -> None:
    assert set(gencodes.gencode_archs(CMAKE)) == {
        "sm_80", "sm_90", "sm_90a", "sm_100a", "sm_103a", "sm_120a", "sm_121a"
    }  # fmt: skip
    pruned = prune(CMAKE)
    code = live(pruned.text)
    # One sm_121a per list, unconditional (the aarch64-only one is dropped, the base kept).
    assert gencodes.gencode_archs(pruned.text) == ["sm_121a", "sm_121a", "sm_121a"]
    assert (
        'set(SGL_KERNEL_CUDA_FLAGS\n    "-DNDEBUG"\n    "-gencode=arch=compute_121a,code=sm_121a"'
        in (code)
    )
    assert 'list(APPEND INFLLM_FLASH_CUDA_FLAGS "-gencode=arch=compute_121a,code=sm_121a")' in code
    assert pruned.kept == [
        "SGL_KERNEL_CUDA_FLAGS",
        "SGL_FLASH_KERNEL_CUDA_FLAGS",
        "INFLLM_FLASH_CUDA_FLAGS",
    ]
    assert pruned.removed_archs == {"sm_80", "sm_90", "sm_90a", "sm_100a", "sm_103a", "sm_120a"}
    for target in ("flash_ops", "common_ops_sm90_build", "flashmla.cmake"):
        assert not re.search(rf"\b{re.escape(target)}\b", code), target
    assert pruned.removed_targets == ["flash_ops", "common_ops_sm90_build"]
    assert pruned.removed_includes == ["flashmla.cmake"]
    # What must stay does: the sm100 build, the flags that are not archs, the thread count.
    for kept in (
        "Python_add_library(common_ops_sm100_build",
        "install(TARGETS common_ops_sm100_build",
        '"--compress-mode=size"',
        '"--threads=${SGL_KERNEL_COMPILE_THREADS}"',
        "set(SGL_KERNEL_ENABLE_FA3 ON)",  # harmless once flash_ops is gone
    ):
        assert kept in code, kept
    # Every changed line says so; the line count is unchanged (the diff reads line by line).
    assert len(pruned.text.splitlines()) == len(CMAKE.splitlines())
    changed = [
        new
        for old, new in zip(CMAKE.splitlines(), pruned.text.splitlines(), strict=True)
        if old != new
    ]
    assert changed and all(gencodes.MARKER in line for line in changed)
    assert "dropped sm_80, sm_90, sm_90a, sm_100a, sm_103a, sm_120a" in pruned.summary()


def test_pruning_twice_changes_nothing() -> None:
    once = prune(CMAKE)
    twice = prune(once.text)
    assert twice.text == once.text and not twice.changed
    assert once.changed


def test_an_arch_renamed_upstream_needs_no_new_step() -> None:
    renamed = CMAKE.replace("compute_103a,code=sm_103a", "compute_100f,code=sm_100f")
    pruned = prune(renamed)
    assert set(gencodes.gencode_archs(pruned.text)) == {"sm_121a"}
    assert "sm_100f" in pruned.removed_archs


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            ("include(${CMAKE_CURRENT_LIST_DIR}/cmake/flashmla.cmake)", ""),
            "include(.../flashmla.cmake) to remove; none found",
        ),
        (
            ("common_ops_sm90_build", "common_ops_hopper_build"),
            "the target common_ops_sm90_build (Python_add_library(common_ops_sm90_build ...)",
        ),
        (
            ('    "-gencode=arch=compute_90,code=sm_90"\n', ""),
            "an unconditional -gencode entry in SGL_KERNEL_CUDA_FLAGS (every entry, from line 30,",
        ),
        (
            ("SGL_KERNEL_CUDA_FLAGS", "KERNEL_FLAGS"),
            "a -gencode entry in SGL_KERNEL_CUDA_FLAGS (set(SGL_KERNEL_CUDA_FLAGS ...) or",
        ),
        (
            (
                '"-gencode=arch=compute_80,code=sm_80"\n    )',
                '"--generate-code=arch=compute_80,code=[sm_80]"\n    )',
            ),
            "line 32 has '--generate-code' in list(), which this step cannot rewrite",
        ),
        (
            (
                "install(TARGETS common_ops_sm90_build ",
                "install(TARGETS common_ops_sm90_build common_ops_sm100_build ",
            ),
            "common_ops_sm90_build alone in install() at line 80; it also names "
            "common_ops_sm100_build",
        ),
        (
            (
                "include(${CMAKE",
                "add_dependencies(spark_all common_ops_sm90_build)\ninclude(${CMAKE",
            ),
            "no use of common_ops_sm90_build outside the commands removed; line 109 still uses it",
        ),
        (
            ('list(APPEND INFLLM_FLASH_CUDA_FLAGS "-gencode=arch=compute_90,code=sm_90")', ""),
            "an unconditional -gencode entry in INFLLM_FLASH_CUDA_FLAGS",
        ),
    ],
    ids=[
        "include",
        "target",
        "flags-list-conditional",
        "flags-list-renamed",
        "arch-flag",
        "shared-install",
        "used-elsewhere",
        "conditional",
    ],
)
def test_anchor_drift_fails_naming_the_file_and_what_was_expected(
    edit: tuple[str, str], expected: str
) -> None:
    old, new = edit
    assert old in CMAKE
    with pytest.raises(AnchorDriftError) as caught:
        prune(CMAKE.replace(old, new))
    message = caught.value.message
    assert message.startswith("anchor drift in sgl-kernel/CMakeLists.txt: expected ")
    assert expected in message, message
    assert "`when`" in (caught.value.hint or "")


def test_the_shipped_steps_cover_every_release_from_0_5_11_once() -> None:
    build = next(
        b
        for b in load_builds(Settings(project_dir=PROJECT, cache_dir=PROJECT / ".none")).values()
        if b.engine == "sglang"
    )
    steps = [s for s in build.steps if s.mode == "source"]
    for version in ALL_RELEASES:
        covering = [s.file for s in steps if SpecifierSet(s.when or "").contains(version)]
        if Version(version) < Version("0.5.11"):
            assert covering == [], version
        else:
            layout = "sgl-kernel" if Version(version) < Version("0.5.17") else "python/sglang"
            assert len(covering) == 1 and covering[0].startswith(layout), (version, covering)
    # Shipped builds are overlays: the steps are not theirs, so their digests do not move.
    assert all(b.mode_steps() == () for b in build_list(PROJECT) if b.image.mode == "overlay")


def build_list(project: Path) -> list[Any]:
    return list(load_builds(Settings(project_dir=project, cache_dir=project / ".none")).values())


# -- the step in the source stage --------------------------------------------------------

SPEC = """\
    engine: sglang
    repo: REPO
    base_branch: main
    package_dir: python/spark_kernel
    mode: source
    steps:
      - {step: sm121a-prune, file: sgl-kernel/CMakeLists.txt, when: "<0.2", mode: source}
      - {step: sm121a-prune, file: python/kernels/aot/CMakeLists.txt, when: ">=0.2", mode: source}
    builds:
      k-0.1.0:
        ref: v0.1.0
      k-0.2.0:
        ref: v0.2.0
      k-0.3.0:
        ref: v0.3.0
      k-overlay:
        ref: v0.2.0
        mode: overlay
"""


def _kernel_tree(dest: Path) -> None:
    shutil.copytree(DATA, dest, dirs_exist_ok=True)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """v0.1.0 keeps the kernel tree at sgl-kernel/, v0.2.0 moves it (as SGLang 0.5.17 did)
    and renames an arch (as 0.5.18 did), v0.3.0 drops the FlashMLA include."""
    root = tmp_path_factory.mktemp("kernels")
    work = root / "work"
    (work / "python" / "spark_kernel").mkdir(parents=True)
    (work / "python" / "spark_kernel" / "__init__.py").write_text("")
    _kernel_tree(work / "sgl-kernel")
    git(work, "init", "-q", "-b", "main")
    commit_all(work, "kernels at sgl-kernel/")
    git(work, "tag", "v0.1.0")
    git(work, "mv", "sgl-kernel", "python/kernels")
    (work / "python" / "kernels").rename(work / "python" / "aot")
    (work / "python" / "kernels").mkdir()
    (work / "python" / "aot").rename(work / "python" / "kernels" / "aot")
    cmake = work / "python" / "kernels" / "aot" / "CMakeLists.txt"
    cmake.write_text(
        cmake.read_text().replace("sm_103a", "sm_100f").replace("compute_103a", "compute_100f")
    )
    commit_all(work, "move the kernel tree; sm_100f")
    git(work, "tag", "v0.2.0")
    cmake.write_text(
        cmake.read_text().replace("include(${CMAKE_CURRENT_LIST_DIR}/cmake/flashmla.cmake)\n", "")
    )
    commit_all(work, "drop FlashMLA")
    git(work, "tag", "v0.3.0")
    bare = root / "upstream.git"
    git(root, "clone", "-q", "--bare", str(work), str(bare))
    git(bare, "config", "uploadpack.allowFilter", "true")
    return bare


def _project(tmp_path: Path, upstream: Path) -> SourceProject:
    project = SourceProject.create(tmp_path, Upstream(bare=upstream, work=upstream))
    project.write_spec(SPEC)
    return project


def _items(payload: dict[str, Any], build: str) -> list[dict[str, Any]]:
    (entry,) = [b for b in payload["builds"] if b["build"] == build]
    items: list[dict[str, Any]] = entry["items"]
    return items


def test_the_step_settles_per_layout_and_drift_is_a_conflict(
    upstream: Path, tmp_path: Path
) -> None:
    project = _project(tmp_path, upstream)
    result = project.run("patches", "--json")
    assert result.exit_code == 1  # k-0.3.0 drifts
    payload = json.loads(result.stdout)
    old = _items(payload, "k-0.1.0")
    assert [(i["kind"], i["id"], i["status"]) for i in old] == [
        ("step", "sm121a-prune:sgl-kernel/CMakeLists.txt", "applied"),
        ("step", "sm121a-prune:python/kernels/aot/CMakeLists.txt", "out-of-range"),
    ]
    assert "dropped sm_80, sm_90, sm_90a, sm_100a, sm_103a, sm_120a" in old[0]["detail"]
    assert old[0]["step"] == "sm121a-prune" and old[0]["file"] == "sgl-kernel/CMakeLists.txt"
    moved = _items(payload, "k-0.2.0")
    assert [i["status"] for i in moved] == ["out-of-range", "applied"]
    assert "sm_100f" in moved[1]["detail"]
    drifted = _items(payload, "k-0.3.0")[1]
    assert drifted["status"] == "conflict"
    assert drifted["detail"] == (
        "anchor drift in python/kernels/aot/CMakeLists.txt: expected "
        "include(.../flashmla.cmake) to remove; none found"
    )
    # An overlay build has no source steps at all (nothing listed, nothing applied).
    assert _items(payload, "k-overlay") == []
    overlay_tree = next(b["tree"] for b in payload["builds"] if b["build"] == "k-overlay")
    assert overlay_tree == git(upstream, "rev-parse", "v0.2.0^{tree}")
    source_tree = next(b["tree"] for b in payload["builds"] if b["build"] == "k-0.2.0")
    assert source_tree != overlay_tree

    out = tmp_path / "tree"
    prepared = project.run("prepare", "k-0.2.0", "--out", str(out))
    assert prepared.exit_code == 0, prepared.output
    text = (out / "python/kernels/aot/CMakeLists.txt").read_text()
    assert set(gencodes.gencode_archs(text)) == {"sm_121a"}
    assert git(out, "log", "-1", "--format=%s") == (
        "sparkbuild: step sm121a-prune:python/kernels/aot/CMakeLists.txt"
    )


def test_a_missing_file_is_missing_not_a_pass(upstream: Path, tmp_path: Path) -> None:
    project = _project(tmp_path, upstream)
    project.write_spec(
        SPEC.replace(
            'file: python/kernels/aot/CMakeLists.txt, when: ">=0.2"',
            'file: python/kernels/aot/CMakeLists.txt, when: ">=0.1"',
        ),
        repo=str(upstream),
    )
    payload = json.loads(project.run("patches", "k-0.1.0", "--json").stdout)
    missing = _items(payload, "k-0.1.0")[1]
    assert missing["status"] == "missing"
    assert "no python/kernels/aot/CMakeLists.txt in the tree at v0.1.0" in missing["detail"]


def test_locked_steps_are_proven_and_a_changed_step_is_stale(
    upstream: Path, tmp_path: Path
) -> None:
    project = _project(tmp_path, upstream)
    assert project.run("lock", "k-0.1.0", "k-0.2.0").exit_code == 0
    locked = project.lock["builds"]["k-0.2.0"]["source"]
    assert locked["steps"] == [
        {"step": "sm121a-prune", "file": "sgl-kernel/CMakeLists.txt", "when": "<0.2",
         "status": "out-of-range", "version": 1},
        {"step": "sm121a-prune", "file": "python/kernels/aot/CMakeLists.txt", "when": ">=0.2",
         "status": "applied", "version": 1},
    ]  # fmt: skip
    assert project.run("prepare", "--locked", "k-0.2.0").exit_code == 0
    checked = project.run("lock", "--check", "k-0.1.0", "k-0.2.0")
    assert checked.exit_code == 0, checked.output
    # A lock whose step version is not this sparkbuild's is stale, offline, and says why.
    text = project.lock_text.replace("version: 1", "version: 0")
    (project.root / "images.lock").write_text(text)
    stale = project.run("lock", "--check", "k-0.2.0")
    assert stale.exit_code == 1
    assert (
        "k-0.2.0: step sm121a-prune:python/kernels/aot/CMakeLists.txt changed since it was "
        "locked (version 0, now 1)" in stale.stderr
    )
    # Expectations are part of the spec: changing them makes the lock stale too.
    project.write_spec(
        SPEC.replace(
            ', when: ">=0.2", mode: source}', ', when: ">=0.2", mode: source, remove_includes: []}'
        ),
        repo=str(upstream),
    )
    (project.root / "images.lock").write_text(text.replace("version: 0", "version: 1"))
    stale = project.run("lock", "--check", "k-0.2.0")
    assert stale.exit_code == 1 and "the spec changed since it was locked" in stale.stderr


def test_bump_checks_a_step_left_behind_and_refuses_a_drifting_one(
    upstream: Path, tmp_path: Path
) -> None:
    project = _project(tmp_path, upstream)
    pinned = (
        "    requirements:\n"
        '      - {req: "flashinfer-python==0.6.8.post1", when: "<0.2", mode: source}\n'
    )
    project.write_spec(
        SPEC.split("    builds:", maxsplit=1)[0]
        + pinned
        + "    builds:\n      k-0.1.0:\n        ref: v0.1.0\n",
        repo=str(upstream),
    )
    git(project.root, "init", "-q", "-b", "main")
    commit_all(project.root, "project")
    args = ("--project", str(project.root), "--cache-dir", str(project.cache), "--quiet")
    result = run_cli(*args, "bump", "sglang", "--to", "v0.2.0", "--json")
    payload = json.loads(result.stdout)
    actions = {i["id"]: (i["action"], i["detail"]) for i in payload["items"]}
    left, moved = actions.values()
    assert left[0] == "follow-range" and "(no sgl-kernel/CMakeLists.txt in v0.2.0)" in left[1]
    assert moved[0] == "keep"
    # FlashInfer (here a stand-in pin) ends before 0.2.0: the new source build says so.
    assert any(
        "k-0.2.0: no flashinfer-python pin for 0.2.0" in note and "keeps the base image's" in note
        for note in payload["notes"]
    ), payload["notes"]
    assert payload["ready"] is True, payload
    result = run_cli(*args, "bump", "sglang", "--to", "v0.3.0", "--json")
    payload = json.loads(result.stdout)
    step = next(i for i in payload["items"] if i["id"].endswith("aot/CMakeLists.txt"))
    assert step["action"] == "conflict" and payload["ready"] is False
    assert "anchor drift in python/kernels/aot/CMakeLists.txt" in step["detail"]
    assert "a step is not rewritten" in step["detail"]


def test_a_source_build_past_the_last_flashinfer_range_is_told() -> None:
    shipped = next(b for b in build_list(PROJECT) if b.name == "sglang-0.5.23-spark")
    source = replace(shipped, image=replace(shipped.image, mode="source"))
    # What 0.5.24's python/pyproject.toml would say (the shape of 0.5.23's: no cubin).
    pyproject = '[project]\nname = "sglang"\ndependencies = ["flashinfer_python[cu13]==0.7.3"]\n'
    assert lapsed_pins(source, pyproject) == []  # 0.5.23 has its pin
    bumped = replace(source, name="sglang-0.5.24-spark", version=Version("0.5.24"))
    # flashinfer-cubin's ranges ended too, but 0.5.16+ do not require it: not a lapse.
    assert bumped.lapsed_requirements() == ["flashinfer-python", "flashinfer-cubin"]
    assert lapsed_pins(bumped, pyproject) == ["flashinfer-python"]
    assert "no flashinfer-python pin for 0.5.24" in lapsed_note(bumped, "flashinfer-python")
    overlay = replace(bumped, image=shipped.image)
    assert lapsed_pins(overlay, pyproject) == []  # overlays keep the base's, on purpose
    older = replace(source, version=Version("0.5.10"))
    assert older.lapsed_requirements() == []  # below every range: not a lapsed pin


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        (
            "{step: sm121a-prune, file: ../../etc/passwd}",
            "is not a plain path inside the repository",
        ),
        ("{step: sm121a-prune, file: --output=x}", "is not a plain path inside the repository"),
        ("{step: sm121a-prune, file: 'HEAD:CMakeLists.txt'}", "is not a plain path inside the"),
        ("{step: rm-rf, file: CMakeLists.txt}", "steps[0].step: Input should be 'sm121a-prune'"),
        ("{step: sm121a-prune, file: a, remove_targets: ['$(x)']}", "is not a plain CMake name"),
    ],
)
def test_a_hostile_step_entry_is_refused_naming_the_field(
    upstream: Path, tmp_path: Path, entry: str, said: str
) -> None:
    project = _project(tmp_path, upstream)
    project.write_spec(
        f"engine: sglang\nrepo: {upstream}\npackage_dir: python/spark_kernel\n"
        f"steps:\n  - {entry}\nbuilds:\n  k:\n    ref: v0.1.0\n"
    )
    result = project.run("patches")
    assert result.exit_code == 2, result.output
    assert "pkg.yaml" in result.stderr and said in result.stderr, result.stderr
    assert "Traceback" not in result.output
