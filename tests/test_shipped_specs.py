"""The shipped specs, patches and profiles against real upstream release files.

A local git repository with one tagged commit per SGLang release (from the PyPI wheels,
laid out as in the upstream repository) stands in for GitHub; `sparkbuild patches --json`
runs over builds/sglang.yaml with the repo overridden to it, for the shipped builds and for
one extra build per release, so every patch is checked on every version.

PR #24436 cannot be fetched here. Its stand-in ref is made from the release files (every
file the PR touches, see tests/support/pr_standins.py), committed on top of v0.5.11 as
`refs/pull/24436/head`.
"""

from __future__ import annotations

import json
import py_compile
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sparkbuild.engines.profiles import load_profile
from sparkbuild.settings import Settings
from sparkbuild.spec import load_builds
from tests.support.cli import run_cli
from tests.support.gitrepos import git
from tests.support.pr_standins import (
    GEMMA4_MTP_CHANGED_FILES,
    GEMMA4_MTP_NEW_FILES,
    push_gemma4_mtp_pr,
)
from tests.support.sglang_releases import ALL_RELEASES, download_wheel, sglang_release_repo

pytestmark = pytest.mark.upstream

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def upstream(test_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cached = sglang_release_repo(test_cache, ALL_RELEASES)
    repo = tmp_path_factory.mktemp("sglang") / "sglang.git"
    git(repo.parent, "clone", "-q", "--bare", str(cached), str(repo))
    push_gemma4_mtp_pr(repo, repo.parent / "work")
    return repo


def _seed_release_wheels(cache: Path, test_cache: Path) -> None:
    """The release wheels `patches` reads pins from for builds with requirements: the same
    files pip would fetch, taken from the test cache instead of downloaded again."""
    for version in ALL_RELEASES:
        wheel = download_wheel(version, test_cache)
        folder = cache / "wheels"  # kept there once the index gives its sha256
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copyfile(wheel, folder / wheel.name)


@pytest.fixture(scope="module")
def report(
    upstream: Path, tmp_path_factory: pytest.TempPathFactory, test_cache: Path
) -> dict[str, Any]:
    """`sparkbuild patches --json` over the shipped spec plus one build per release."""
    project = tmp_path_factory.mktemp("project")
    shutil.copytree(ROOT / "patches", project / "patches")
    (project / "builds").mkdir()
    spec = yaml.safe_load((ROOT / "builds" / "sglang.yaml").read_text())
    for version in ALL_RELEASES:
        spec["builds"][f"every-{version}"] = {"ref": f"v{version}"}
    (project / "builds" / "sglang.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    _seed_release_wheels(project / "cache", test_cache)
    result = run_cli(
        "--project",
        str(project),
        "--cache-dir",
        str(project / "cache"),
        "--quiet",
        "--repo",
        f"sglang={upstream}",
        "patches",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    data["_project"] = str(project)
    data["_upstream"] = str(upstream)
    return data


def by_build(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {build["build"]: build for build in report["builds"]}


def test_every_patch_applies_inside_its_range_and_only_there(report: dict[str, Any]) -> None:
    spec = yaml.safe_load((ROOT / "builds" / "sglang.yaml").read_text())
    ranges = {p["file"]: SpecifierSet(p["when"]) for p in spec["patches"]}
    for version in ALL_RELEASES:
        build = by_build(report)[f"every-{version}"]
        for item in build["items"]:
            if item["kind"] != "patch":
                continue
            inside = Version(version) in ranges[item["file"]]
            expected = "applied" if inside else "out-of-range"
            assert item["status"] == expected, (version, item["file"], item["detail"])
    statuses = {i["status"] for b in report["builds"] for i in b["items"]}
    assert "conflict" not in statuses and "missing" not in statuses


def test_shipped_builds_carry_what_the_readme_says(report: dict[str, Any]) -> None:
    def applied(name: str) -> set[str]:
        return {i["id"] for i in by_build(report)[name]["items"] if i["status"] == "applied"}

    tm12 = "patches/sglang/reserved-tokens-none-tokenizer-manager-0.5.12.patch"
    defaults12 = "patches/sglang/speculative-defaults-frozen-kv-mtp-server-args-0.5.12.patch"
    draft = "patches/sglang/draft-memory-before-kv-pool.patch"
    assert applied("sglang-0.5.11-gemma4-mtp") == {"#24436", tm12, defaults12, draft}
    assert applied("sglang-0.5.12-spark") == {tm12, defaults12, draft}
    assert applied("sglang-0.5.23-spark") == {
        "patches/sglang/reserved-tokens-none-utils-0.5.18.patch",
        "patches/sglang/speculative-defaults-frozen-kv-mtp-hook-0.5.19.patch",
        "patches/sglang/draft-kv-nextn-without-draft-path-0.5.22.patch",
    }
    for name in ("sglang-0.5.11-gemma4-mtp", "sglang-0.5.12-spark"):
        (conflict,) = by_build(report)[name]["requirements"]["conflicts"]
        assert conflict["overridden"] and conflict["theirs"] == "transformers==5.6.0"
    assert "requirements" not in by_build(report)["sglang-0.5.23-spark"]
    pr = {i["id"]: i for i in by_build(report)["sglang-0.5.12-spark"]["items"]}["#24436"]
    assert pr["status"] == "out-of-range"  # first released in 0.5.12 (see the spec)


def test_pr_standin_touches_every_file_the_pr_touches(report: dict[str, Any]) -> None:
    items = {i["id"]: i for i in by_build(report)["sglang-0.5.11-gemma4-mtp"]["items"]}
    assert set(items["#24436"]["files"]) == set(GEMMA4_MTP_NEW_FILES + GEMMA4_MTP_CHANGED_FILES)


def test_every_patched_file_byte_compiles(report: dict[str, Any], tmp_path: Path) -> None:
    project = Path(report["_project"])
    builds = ["sglang-0.5.11-gemma4-mtp", "sglang-0.5.12-spark", "sglang-0.5.23-spark"]
    builds += [f"every-{v}" for v in ("0.5.13", "0.5.16", "0.5.17")]
    for name in builds:
        build = by_build(report)[name]
        changed = sorted(
            {f for i in build["items"] if i["status"] == "applied" for f in i["files"]}
        )
        assert changed, name
        out = tmp_path / name
        result = run_cli(
            "--project",
            str(project),
            "--cache-dir",
            str(project / "cache"),
            "--quiet",
            "--repo",
            f"sglang={report['_upstream']}",
            "prepare",
            name,
            "--out",
            str(out),
        )
        assert result.exit_code == 0, result.stderr
        assert result.stdout.strip() == build["tree"]
        for path in changed:
            if path.endswith(".py"):
                py_compile.compile(str(out / path), doraise=True)


def test_shipped_profiles_and_builds_agree(tmp_path: Path) -> None:
    settings = Settings(project_dir=ROOT, cache_dir=tmp_path)
    names = {p.stem for p in (ROOT / "smoke").glob("*.yaml")}
    without_floor: set[str] = set()
    for name in names:
        _, profile = load_profile(settings, name, model="/models/x")
        if not profile.expect.speculation:
            continue
        if profile.expect.min_accept_len is None:
            without_floor.add(name)
        else:
            assert profile.expect.min_accept_len > 1.0, name
    # Only the CI reference (random weights, n-gram) relies on the default "> 1.0"; a Spark
    # profile without its own floor would let a weak draft model pass.
    assert without_floor == {"cpu-reference"}, (
        f"speculative profiles without min_accept_len: {without_floor}"
    )
    for build in load_builds(settings).values():
        assert build.smoke_profiles, f"{build.name} lists no smoke profile"
        missing = set(build.smoke_profiles) - names
        assert not missing, f"{build.name} names unknown profiles {missing}"


def test_patch_headers_explain_themselves() -> None:
    for patch in sorted((ROOT / "patches").rglob("*.patch")):
        header = patch.read_text().split("\ndiff --git ", 1)[0]
        assert len(header.splitlines()) >= 5, f"{patch.name}: header too short"
        assert "when:" in header, f"{patch.name}: header does not state its version range"
        result = subprocess.run(
            ["git", "apply", "--numstat", str(patch)], capture_output=True, check=False
        )
        assert result.returncode == 0, f"{patch.name} is not a valid diff"
