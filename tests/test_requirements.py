"""`requirements:` in specs: resolve real wheels, pin them by sha256, check the release's pins.

Against real parts: the SGLang release repository built from the PyPI wheels (the source
stage runs on it), the release's own wheel METADATA, and the transformers wheel pip downloads
from PyPI for linux/aarch64. The first use ships in builds/sglang.yaml (transformers 5.8.1
on 0.5.11/0.5.12, which pin 5.6.0); as shipped before, the 0.5.12 build kept 5.6.0, which
has no gemma4_assistant model type.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.version import Version

from sparkbuild import requirements
from sparkbuild.errors import SparkbuildError, SpecError
from sparkbuild.settings import Settings
from sparkbuild.spec import load_builds
from tests.support.cli import run_cli
from tests.support.sglang_releases import ALL_RELEASES, download_wheel, sglang_release_repo

ROOT = Path(__file__).resolve().parent.parent
PIN = "transformers==5.8.1"


def _project(tmp_path: Path, requirement: dict[str, Any], version: str = "0.5.12") -> Path:
    project = tmp_path / "project"
    (project / "builds").mkdir(parents=True)
    spec = {
        "engine": "sglang",
        "repo": "https://github.com/sgl-project/sglang.git",
        "package_dir": "python/sglang",
        "requirements": [requirement],
        "builds": {"b": {"ref": f"v{version}", "base_image": "x"}},
    }
    (project / "builds" / "sglang.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return project


def test_requirements_are_parsed_filtered_by_when_and_digested(tmp_path: Path) -> None:
    project = _project(tmp_path, {"req": PIN, "when": ">=0.5.11,<0.5.13", "override": True})
    settings = Settings(project_dir=project, cache_dir=tmp_path / "cache")
    build = load_builds(settings)["b"]
    (active,) = build.active_requirements()
    assert (active.name, active.override, build.image.python) == ("transformers", True, "3.12")
    later = _project(tmp_path / "later", {"req": PIN, "when": ">=0.5.11,<0.5.13"}, "0.5.23")
    later_build = load_builds(Settings(project_dir=later, cache_dir=tmp_path / "c2"))["b"]
    assert later_build.active_requirements() == ()
    assert build.spec_digest() != later_build.spec_digest()


def test_a_requirement_that_is_not_pep508_names_file_and_field(tmp_path: Path) -> None:
    project = _project(tmp_path, {"req": "transformers >>> 5"})
    with pytest.raises(SpecError, match=r"requirements.*PEP 508"):
        load_builds(Settings(project_dir=project, cache_dir=tmp_path / "cache"))


@pytest.fixture(scope="module")
def wheel_cache(test_cache: Path) -> Path:
    return test_cache / "requirements"


def _settings(project: Path, cache: Path, test_cache: Path, version: str) -> Settings:
    """Settings whose cache already holds the release wheel pip would fetch for METADATA."""
    release = cache / "release-wheels" / f"sglang-{version}"
    release.mkdir(parents=True, exist_ok=True)
    wheel = download_wheel(version, test_cache)
    if not (release / wheel.name).exists():
        shutil.copyfile(wheel, release / wheel.name)
    return Settings(project_dir=project, cache_dir=cache)


@pytest.mark.upstream
@pytest.mark.parametrize("version", ["0.5.11", "0.5.12"])
def test_release_pins_5_6_0_and_the_requirement_conflicts_naming_both(
    tmp_path: Path, test_cache: Path, version: str
) -> None:
    project = _project(tmp_path, {"req": PIN}, version)
    settings = _settings(project, tmp_path / "cache", test_cache, version)
    build = load_builds(settings)["b"]
    pins, source = requirements.release_pins(build, settings, pyproject=None)
    assert str(pins["transformers"]) == "transformers==5.6.0"
    assert source.endswith("METADATA")
    (conflict,) = requirements.spec_conflicts(build, pins, source)
    assert (conflict.ours, conflict.theirs, conflict.overridden) == (
        PIN,
        "transformers==5.6.0",
        False,
    )
    with pytest.raises(SpecError, match=r"'transformers==5\.8\.1' conflicts with .*5\.6\.0"):
        requirements.raise_on_conflicts(build, [conflict])


@pytest.mark.upstream
def test_resolve_pins_the_aarch64_wheel_by_sha256_and_it_has_gemma4_assistant(
    tmp_path: Path, wheel_cache: Path
) -> None:
    project = _project(tmp_path, {"req": PIN, "override": True})
    settings = Settings(project_dir=project, cache_dir=wheel_cache)
    build = load_builds(settings)["b"]
    pinned, wheels = requirements.resolve(build, settings)
    (pin,) = pinned
    path = wheels["transformers"]
    assert (pin.name, pin.version) == ("transformers", "5.8.1")
    assert pin.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    with zipfile.ZipFile(path) as archive:
        assert "transformers/models/gemma4_assistant/__init__.py" in archive.namelist()
    assert requirements.locked_wheel(pin, settings) == path
    tampered = requirements.PinnedWheel(**{**pin.to_dict(), "sha256": "0" * 64})
    with pytest.raises(SparkbuildError, match=r"does not match images\.lock"):
        requirements.locked_wheel(tampered, settings)


def test_image_layer_installs_exactly_the_pinned_files(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel")
    pin = requirements.PinnedWheel("demo==1.0", "demo", "1.0", wheel.name, "ab" * 32)
    requirements.write_context(tmp_path / "ctx", [pin], [wheel])
    folder = tmp_path / "ctx" / requirements.CONTEXT_DIR
    assert (folder / wheel.name).read_bytes() == wheel.read_bytes()
    assert (folder / "requirements.txt").read_text() == f"demo==1.0 --hash=sha256:{'ab' * 32}\n"
    dockerfile = requirements.dockerfile_with_layer(b"FROM x\nRUN true\n").decode()
    assert dockerfile.startswith("FROM x\nRUN true\n")
    assert "--no-index --no-deps --require-hashes" in dockerfile
    bad = requirements.PinnedWheel("x", "x", "1", "../evil.whl", "ab" * 32)
    with pytest.raises(SparkbuildError, match="unsafe wheel file name"):
        requirements.write_context(tmp_path / "ctx2", [bad], [wheel])


def _run(project: Path, cache: Path, repo: Path, *args: str) -> Any:
    base = ["--project", str(project), "--cache-dir", str(cache), "--quiet"]
    return run_cli(*base, "--repo", f"sglang={repo}", *args)


@pytest.mark.upstream
def test_lock_pins_the_shipped_requirement_and_refuses_an_unacknowledged_conflict(
    tmp_path: Path, test_cache: Path, wheel_cache: Path
) -> None:
    repo = sglang_release_repo(test_cache, ALL_RELEASES)
    shipped = yaml.safe_load((ROOT / "builds" / "sglang.yaml").read_text())
    (requirement,) = shipped["requirements"]
    project = _project(tmp_path, requirement)
    cache = tmp_path / "cache"
    settings = _settings(project, cache, test_cache, "0.5.12")
    shutil.copytree(wheel_cache / "wheels", cache / "wheels", dirs_exist_ok=True)

    result = _run(project, cache, repo, "patches", "--json")
    assert result.exit_code == 0, result.output
    (build,) = json.loads(result.stdout)["builds"]
    (conflict,) = build["requirements"]["conflicts"]
    assert conflict["overridden"] and "overrides sglang 0.5.12's own" in conflict["message"]

    result = _run(project, cache, repo, "lock", "b")
    assert result.exit_code == 0, result.output
    lock = yaml.safe_load(settings.lock_file.read_text())
    (pin,) = lock["builds"]["b"]["requirements"]
    assert (pin["name"], pin["version"], pin["requirement"]) == ("transformers", "5.8.1", PIN)
    wheel = cache / "wheels" / pin["filename"]
    assert pin["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert _run(project, cache, repo, "lock", "--check").exit_code == 0

    plain = _project(tmp_path / "plain", {"req": PIN})
    _settings(plain, cache, test_cache, "0.5.12")
    before = settings.lock_file.read_text()
    result = _run(plain, cache, repo, "lock", "b")
    assert result.exit_code != 0
    assert "transformers==5.8.1" in result.output and "transformers==5.6.0" in result.output
    assert "override: true" in result.output
    assert settings.lock_file.read_text() == before  # the other project's lock is untouched
    assert (
        not (plain / "images.lock").exists()
        or "requirements" not in (plain / "images.lock").read_text()
    )


def test_shipped_spec_pins_transformers_only_where_the_release_cannot_load_the_drafter(
    tmp_path: Path,
) -> None:
    builds = load_builds(Settings(project_dir=ROOT, cache_dir=tmp_path))
    for build in builds.values():
        wanted = [r.req for r in build.active_requirements()]
        needs = build.engine == "sglang" and build.version < Version("0.5.13")
        assert wanted == ([PIN] if needs else []), build.name
