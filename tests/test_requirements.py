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
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.version import Version
from pydantic import ValidationError

from sparkbuild import lockfile, requirements
from sparkbuild.errors import SparkbuildError, SpecError, UntrustedCacheError
from sparkbuild.settings import Settings
from sparkbuild.spec import Build, load_builds
from tests.support.cli import run_cli
from tests.support.sglang_releases import ALL_RELEASES, download_wheel, sglang_release_repo
from tests.support.vllm_sdist import vllm_sdist

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
    release = cache / "wheels"  # kept there once the index gives its sha256
    release.mkdir(mode=0o700, parents=True, exist_ok=True)
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
    tampered = pin.model_copy(update={"sha256": "0" * 64})
    with pytest.raises(SparkbuildError, match=r"does not match images\.lock"):
        requirements.locked_wheel(tampered, settings)


def test_image_layer_installs_exactly_the_pinned_files(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel")
    pin = lockfile.LockedWheel(
        requirement="demo==1.0", name="demo", version="1.0", filename=wheel.name, sha256="ab" * 32
    )
    requirements.write_context(tmp_path / "ctx", [pin], [wheel])
    folder = tmp_path / "ctx" / requirements.CONTEXT_DIR
    assert (folder / wheel.name).read_bytes() == wheel.read_bytes()
    assert (folder / "requirements.txt").read_text() == f"demo==1.0 --hash=sha256:{'ab' * 32}\n"
    dockerfile = requirements.dockerfile_with_layer(b"FROM x\nRUN true\n").decode()
    assert dockerfile.startswith("FROM x\nRUN true\n")
    assert "--no-index --no-deps --require-hashes" in dockerfile
    fields = {"requirement": "x", "name": "x", "version": "1", "sha256": "ab" * 32}
    with pytest.raises(ValidationError, match="filename"):  # the lock refuses it on read
        lockfile.LockedWheel(**fields, filename="../evil.whl")
    bad = lockfile.LockedWheel.model_construct(None, **fields, filename="../evil.whl")
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
    requirement = next(r for r in shipped["requirements"] if r["req"] == PIN)
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


FLASHINFER = ("flashinfer-python", "flashinfer-cubin")
SOURCE_RELEASES = [v for v in ALL_RELEASES if Version(v) >= Version("0.5.11")]


def _shipped_with(
    tmp_path: Path, engine: str, versions: list[str], mode: str, *, keep: bool = True
) -> dict[str, Build]:
    """The shipped spec of ``engine`` with one build per version in ``mode`` (its file-level
    requirements as shipped; without the source-only ones when ``keep`` is false)."""
    spec = yaml.safe_load((ROOT / "builds" / f"{engine}.yaml").read_text())
    if not keep:
        spec["requirements"] = [r for r in spec.get("requirements", []) if "mode" not in r]
    spec["builds"] = {
        f"{mode}-{v}": {"ref": f"v{v}", "mode": mode, "base_image": "x"} for v in versions
    }
    project = tmp_path / f"{engine}-{mode}-{keep}"
    (project / "builds").mkdir(parents=True)
    shutil.copytree(ROOT / "patches", project / "patches")
    (project / "builds" / f"{engine}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return load_builds(Settings(project_dir=project, cache_dir=tmp_path / "cache"))


def _flashinfer(build: Build) -> dict[str, str]:
    return {
        r.name: str(r.parsed().specifier)
        for r in build.active_requirements()
        if r.name.startswith("flashinfer")
    }


@pytest.mark.upstream
def test_source_builds_pin_exactly_the_flashinfer_each_release_requires(
    tmp_path: Path, test_cache: Path
) -> None:
    """Every SGLang release 0.5.11-0.5.23 built from source gets the FlashInfer its own wheel
    METADATA pins (flashinfer_python, and flashinfer_cubin while it is pinned); overlay
    builds get none, and their spec digests are what they were without these lines."""
    source = _shipped_with(tmp_path, "sglang", SOURCE_RELEASES, "source")
    overlay = _shipped_with(tmp_path, "sglang", SOURCE_RELEASES, "overlay")
    overlay_before = _shipped_with(tmp_path, "sglang", SOURCE_RELEASES, "overlay", keep=False)
    source_before = _shipped_with(tmp_path, "sglang", SOURCE_RELEASES, "source", keep=False)
    cubin_pinned = set()
    for version in SOURCE_RELEASES:
        build = source[f"source-{version}"]
        metadata = requirements.wheel_metadata(download_wheel(version, test_cache))
        theirs = requirements.pins_from_metadata(metadata, build.image.python)
        release = {name: str(theirs[name].specifier) for name in FLASHINFER if name in theirs}
        assert release["flashinfer-python"].startswith("=="), version
        assert _flashinfer(build) == release, version
        if "flashinfer-cubin" in release:
            cubin_pinned.add(version)
        conflicts = requirements.spec_conflicts(build, theirs, "METADATA")
        assert all(c.overridden for c in conflicts), (version, conflicts)
        plain = overlay[f"overlay-{version}"]
        assert _flashinfer(plain) == {}, version
        assert plain.spec_digest() == overlay_before[f"overlay-{version}"].spec_digest()
        assert build.spec_digest() != source_before[f"source-{version}"].spec_digest()
    # The releases stopped pinning the cubin package at 0.5.16 (PyPI has none after 0.6.13).
    assert max(cubin_pinned, key=Version) == "0.5.15.post1"


@pytest.mark.upstream
def test_vllm_source_build_pins_the_flashinfer_of_the_0_33_sdist(tmp_path: Path) -> None:
    (build,) = _shipped_with(tmp_path, "vllm", ["0.33.0"], "source").values()
    with tarfile.open(vllm_sdist()) as sdist:
        member = sdist.extractfile("vllm-0.33.0/PKG-INFO")
        assert member is not None
        theirs = requirements.pins_from_metadata(member.read().decode(), build.image.python)
    assert _flashinfer(build) == {"flashinfer-python": str(theirs["flashinfer-python"].specifier)}
    assert _flashinfer(build) == {"flashinfer-python": "==0.7.2.post1"}
    (overlay,) = _shipped_with(tmp_path, "vllm", ["0.33.0"], "overlay").values()
    assert _flashinfer(overlay) == {}


@pytest.mark.upstream
def test_a_source_build_pins_the_pypi_flashinfer_wheel_and_it_fits_the_release(
    tmp_path: Path, test_cache: Path, wheel_cache: Path
) -> None:
    """The 0.5.11 source build's flashinfer-python resolves to the py3-none-any wheel on PyPI
    (the file a linux/aarch64 image installs), pinned by its sha256, and none of its own
    dependencies contradicts 0.5.11's pins."""
    build = _shipped_with(tmp_path, "sglang", ["0.5.11"], "source")["source-0.5.11"]
    requirement = next(r for r in build.active_requirements() if r.name == "flashinfer-python")
    settings = Settings(project_dir=tmp_path, cache_dir=wheel_cache)
    pin, path = requirements.resolve_one(requirement, build, settings)
    assert (pin.name, pin.version) == ("flashinfer-python", "0.6.8.post1")
    assert pin.filename == "flashinfer_python-0.6.8.post1-py3-none-any.whl"
    assert pin.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    metadata = requirements.wheel_metadata(download_wheel("0.5.11", test_cache))
    theirs = requirements.pins_from_metadata(metadata, build.image.python)
    conflicts = requirements.wheel_conflicts(
        build, [pin], {pin.name: path}, theirs, "sglang 0.5.11 METADATA"
    )
    assert conflicts == []


def test_a_requirement_mode_is_overlay_or_source(tmp_path: Path) -> None:
    project = _project(tmp_path, {"req": PIN, "mode": "sauce"})
    with pytest.raises(SpecError, match=r"requirements.*mode"):
        load_builds(Settings(project_dir=project, cache_dir=tmp_path / "cache"))


def _planted_wheel(path: Path, requires: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        info = "sglang-0.5.12.dist-info"
        archive.writestr(f"{info}/METADATA", f"Name: sglang\nVersion: 0.5.12\n{requires}\n")


@pytest.mark.upstream
def test_a_planted_release_wheel_is_never_read_for_the_release_pins(
    tmp_path: Path, test_cache: Path
) -> None:
    """Issue 34, What 2: `patches` and `lock` took the release's pins from any wheel in
    ``release-wheels/sglang-VERSION/``. Now only from the file the package index gives, by
    its sha256 (as preflight's): a planted file, under any name, is never read."""
    project = _project(tmp_path, {"req": PIN})
    cache = tmp_path / "cache"
    real = download_wheel("0.5.12", test_cache)
    evil = "Requires-Dist: transformers==6.6.6"
    _planted_wheel(cache / "release-wheels" / "sglang-0.5.12" / real.name, evil)
    _planted_wheel(cache / "wheels" / real.name, evil)
    _planted_wheel(cache / "wheels" / "sglang-0.5.12-0evil-py3-none-any.whl", evil)
    settings = Settings(project_dir=project, cache_dir=cache)
    build = load_builds(settings)["b"]

    pins, source = requirements.release_pins(build, settings, pyproject=None)

    assert str(pins["transformers"]) == "transformers==5.6.0"
    assert source == f"{real.name} METADATA"
    wheel = cache / "wheels" / real.name
    assert hashlib.sha256(wheel.read_bytes()).digest() == hashlib.sha256(real.read_bytes()).digest()


@pytest.mark.upstream
def test_a_pinned_wheel_is_never_read_through_a_link_or_from_a_cache_others_write(
    tmp_path: Path,
) -> None:
    """Issue 46, What 3: the wheel a lock pins is hashed in the cache and copied from it into
    the image; a symlink planted at its name was followed (its target could change between
    the hash and the copy), and a wheel cache others could write was used."""
    project = _project(tmp_path, {"req": "iniconfig==2.3.0"})
    settings = Settings(project_dir=project, cache_dir=tmp_path / "cache")
    build = load_builds(settings)["b"]
    pin, path = requirements.resolve_one(build.active_requirements()[0], build, settings)
    elsewhere = tmp_path / "elsewhere.whl"
    shutil.copyfile(path, elsewhere)
    path.unlink()
    path.symlink_to(elsewhere)

    got = requirements.locked_wheel(pin, settings)

    assert got == path and not got.is_symlink()
    assert hashlib.sha256(got.read_bytes()).hexdigest() == pin.sha256
    path.parent.chmod(0o777)
    with pytest.raises(UntrustedCacheError, match="writable by group or others"):
        requirements.locked_wheel(pin, settings)
