"""An engine is its own files, and nothing else (CONTRIBUTING, "A new engine").

llama.cpp was added as a newcomer would add a third engine: its adapter module, its data (a
sparkrun flag map, its signatures), its Dockerfile, its spec and its profiles. These tests
hold that to the code: without those files the package is the two-engine sparkbuild, no
other file of it knows the engine's name, and with them the third engine goes through spec
validation, the lock, source build arguments, profiles, smoke's command lines, ``releases``
and ``bump`` (its ``b<build>`` release tags) on a real git repository.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from sparkbuild.adapters import adapter_for, adapter_type, engine_names
from sparkbuild.adapters.names import shipped_engines
from sparkbuild.engines.launch import TargetChoice, make_target
from sparkbuild.engines.profiles import load_profile
from sparkbuild.engines.targets import ContainerTarget, ProcessTarget
from sparkbuild.image import context, source_args
from sparkbuild.settings import Settings
from sparkbuild.spec import load_builds
from tests.support.cli import CliResult, run_cli
from tests.support.gitrepos import commit_all, git, tagged_repo
from tests.test_engine_names import engine_names_in

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "sparkbuild"
ENGINE = "llamacpp"


def engine_files(engine: str, root: Path = ROOT) -> list[Path]:
    """What adding ``engine`` takes, found by CONTRIBUTING's rule: its adapter module (or
    package), the package data named after it, its spec and the profiles that serve it."""
    package = root / "src" / "sparkbuild"
    adapter = package / "adapters" / f"{engine}.py"
    found = [adapter if adapter.exists() else package / "adapters" / engine]
    found += [
        path
        for path in sorted((package / "data").rglob("*"))
        if path.is_file() and (path.stem == engine or path.name.startswith(f"{engine}-"))
    ]
    found.append(root / "builds" / f"{engine}.yaml")
    found += [
        path
        for path in sorted((root / "smoke").glob("*.yaml"))
        if (yaml.safe_load(path.read_text()) or {}).get("engine") == engine
    ]
    return found


def test_the_third_engine_is_four_kinds_of_file() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in engine_files(ENGINE)}
    assert files == {
        "src/sparkbuild/adapters/llamacpp.py",
        "src/sparkbuild/data/docker/llamacpp-source.Dockerfile",
        "src/sparkbuild/data/signatures/llamacpp.yaml",
        "src/sparkbuild/data/sparkrun/flags-0.4.2/llamacpp.yaml",
        "builds/llamacpp.yaml",
        "smoke/llamacpp-cpu-reference.yaml",
        "smoke/llamacpp-gpt-oss-120b-spark.yaml",
    }
    assert engine_names() == shipped_engines() == ["llamacpp", "sglang", "vllm"]


@pytest.fixture(scope="module")
def without_engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project (package, noxfile, specs, profiles) without llama.cpp's files."""
    copy = tmp_path_factory.mktemp("two-engines")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(ROOT / "src", copy / "src", ignore=ignore)
    for folder in ("builds", "smoke", "patches"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=ignore)
    shutil.copy(ROOT / "noxfile.py", copy / "noxfile.py")
    for path in engine_files(ENGINE, copy):
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return copy


def test_without_its_files_sparkbuild_is_the_two_engine_one(without_engine: Path) -> None:
    """The registry, the specs and the profiles of the copy, in a fresh interpreter that
    imports the copy's package."""
    probe = textwrap.dedent(
        """
        import json, sys
        from pathlib import Path
        from sparkbuild.adapters import engine_names
        from sparkbuild.settings import Settings
        from sparkbuild.spec import load_builds
        from sparkbuild.engines.profiles import load_profile
        root = Path(sys.argv[1])
        settings = Settings(project_dir=root, cache_dir=root / "cache")
        builds = load_builds(settings)
        engines = sorted({b.engine for b in builds.values()})
        profiles = [load_profile(settings, p.stem, model="/m")[1].engine
                    for p in (root / "smoke").glob("*.yaml")]
        print(json.dumps([engine_names(), engines, sorted(set(profiles))]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(without_engine)],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(without_engine / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    registry, specs, profiles = json.loads(done.stdout)
    assert registry == specs == profiles == ["sglang", "vllm"]


def test_no_other_file_names_it(without_engine: Path) -> None:
    """The engine-name rule (tests/test_engine_names.py) over the copy's every module and the
    noxfile, for the engine that is gone: nothing outside its files knew of it."""
    checked = [*sorted((without_engine / "src").rglob("*.py")), without_engine / "noxfile.py"]
    assert [hit for path in checked for hit in engine_names_in(path, [ENGINE])] == []
    data = without_engine / "src" / "sparkbuild" / "data"
    assert not [
        p for p in data.rglob("*") if p.is_file() and ENGINE in p.read_text(errors="ignore")
    ]


# --- the third engine through the stages that list engines ---------------------------------

B_TAGS = ("b11400", "b11434", "b11500")
SPEC = """\
engine: llamacpp
repo: REPO
mode: source
platform: linux/arm64
base_image: nvidia/cuda:13.0.1-devel-ubuntu24.04
patches:
  - {file: patches/llamacpp/arch-note.patch}
builds:
  llamacpp-b11434-spark:
    ref: b11434
    smoke: [llamacpp-cpu-reference]
"""
PATCH = """\
Adds a note to the architecture list (a test patch: the spec carries patches as any engine's).
--- a/src/llama-arch.cpp
+++ b/src/llama-arch.cpp
@@ -1,2 +1,3 @@
 // architectures
+// sparkbuild: carried
 { LLM_ARCH_LLAMA,            "llama"            },
"""


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A llama.cpp-shaped repository tagged as llama.cpp tags releases (b<build>), with a
    v-tag that is no llama.cpp release among them."""
    work = tmp_path_factory.mktemp("llama.cpp")
    (work / "src").mkdir()
    arch = work / "src" / "llama-arch.cpp"
    arch.write_text('// architectures\n{ LLM_ARCH_LLAMA,            "llama"            },\n')
    tagged_repo(work, B_TAGS[0], "b11400")
    for tag in (*B_TAGS[1:], "v1.0.0"):
        arch.write_text(arch.read_text() + f"// {tag}\n")
        commit_all(work, tag)
        git(work, "tag", tag)
    return work


def _project(tmp_path: Path, upstream: Path) -> tuple[Path, Settings]:
    root = tmp_path / "project"
    (root / "builds").mkdir(parents=True)
    (root / "patches" / "llamacpp").mkdir(parents=True)
    (root / "patches" / "llamacpp" / "arch-note.patch").write_text(PATCH)
    (root / "builds" / "llamacpp.yaml").write_text(SPEC.replace("REPO", str(upstream)))
    shutil.copytree(ROOT / "smoke", root / "smoke")
    return root, Settings(project_dir=root, cache_dir=tmp_path / "cache")


def _run(root: Path, *args: str) -> CliResult:
    return run_cli("--project", str(root), "--cache-dir", str(root.parent / "cache"), *args)


def test_the_spec_lock_and_source_build_take_it(tmp_path: Path, upstream: Path) -> None:
    root, settings = _project(tmp_path, upstream)
    (build,) = load_builds(settings).values()
    assert (build.engine, str(build.version), build.package_dir) == (ENGINE, "11434", "")
    assert adapter_type(ENGINE).release_tags.tag_of(build.version) == "b11434"
    args = source_args.source_args(build)
    assert args["CMAKE_CUDA_ARCHITECTURES"] == "121a-real"
    assert "TORCH_CUDA_ARCH_LIST" not in args  # a Python engine's, not every engine's
    found = context.find_dockerfile(build, settings)
    assert (found.origin, found.path.name) == ("sparkbuild", "llamacpp-source.Dockerfile")
    result = _run(root, "lock")
    assert result.exit_code == 0, result.output
    entry = yaml.safe_load((root / "images.lock").read_text())["builds"][build.name]
    assert entry["source"]["commit"] == git(upstream, "rev-parse", "b11434")
    assert _run(root, "lock", "--check").exit_code == 0


def test_an_overlay_build_without_a_package_is_refused(tmp_path: Path, upstream: Path) -> None:
    root, _ = _project(tmp_path, upstream)
    spec = root / "builds" / "llamacpp.yaml"
    spec.write_text(spec.read_text().replace("mode: source", "mode: overlay"))
    result = _run(root, "patches")
    assert result.exit_code == 2
    assert "package_dir is needed for overlay builds (llamacpp-b11434-spark)" in result.stderr


def test_smoke_renders_its_command_lines(tmp_path: Path, upstream: Path) -> None:
    _, settings = _project(tmp_path, upstream)
    _, profile = load_profile(settings, "llamacpp-cpu-reference", model="/models/tiny.gguf")
    adapter = adapter_for(ENGINE)
    command = make_target(
        TargetChoice(command="/opt/llama-server"), profile, adapter, None, stage="smoke"
    )
    assert isinstance(command, ProcessTarget)
    argv = command.argv
    assert argv[:7] == ["/opt/llama-server", "-m", "/models/tiny.gguf", "--host", "127.0.0.1",
                        "--port", str(command.port)]  # fmt: skip
    assert argv[7] == "--metrics"  # /metrics is off without it
    assert argv[argv.index("-md") + 1] == "/models/tiny.gguf"  # {model}: it drafts for itself
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    local = profile.model_copy(update={"model": str(gguf)})
    container = make_target(
        TargetChoice(image="sparkbuild/llamacpp:b11434"), local, adapter, None, stage="smoke"
    )
    assert isinstance(container, ContainerTarget)
    assert container.entrypoint == ["llama-server"] and container.container_port == 8080
    mount = local.container.model_mount
    assert container.args[:2] == ["-m", mount]  # the file, mounted where the server reads it
    assert container.args[container.args.index("-md") + 1] == mount
    hub = adapter.serve_args("ggml-org/gpt-oss-120b-GGUF", "0.0.0.0", 8080, [])
    assert hub[:2] == ["-hf", "ggml-org/gpt-oss-120b-GGUF"]


def test_releases_and_bump_read_build_tags(tmp_path: Path, upstream: Path) -> None:
    """b<build> tags are releases (a v-tag in the same repository is not llama.cpp's), and
    bump carries the spec, its patch included, to one."""
    root, settings = _project(tmp_path, upstream)
    listed = _run(root, "releases", ENGINE, "--json")
    assert listed.exit_code == 0, listed.output
    releases = json.loads(listed.stdout)["releases"]
    assert [(r["tag"], r["version"]) for r in releases] == [("b11500", "11500")]
    every = json.loads(_run(root, "releases", ENGINE, "--all", "--json").stdout)["releases"]
    assert [r["tag"] for r in every] == ["b11500", "b11434", "b11400"]
    bumped = _run(root, "bump", ENGINE, "--to", "b11500", "--write", "--json")
    assert bumped.exit_code == 0, bumped.output
    spec = yaml.safe_load((root / "builds" / "llamacpp.yaml").read_text())
    new = spec["builds"]["llamacpp-b11500-spark"]
    assert new["ref"] == "b11500" and "version" not in new  # the tag names the version
    (latest,) = [b for b in load_builds(settings).values() if str(b.version) == "11500"]
    assert latest.engine == ENGINE
    refused = _run(root, "bump", ENGINE, "--to", "b99999")
    assert refused.exit_code == 2 and "no tag b99999" in refused.stderr
