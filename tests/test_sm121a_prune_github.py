"""The shipped sm121a-prune steps on the real sgl-kernel CMake file of every SGLang release
they cover, read from GitHub at the release tag (nothing is kept). Needs github.com: where it
is unreachable the tests are deselected and the summary says so (tests/conftest.py)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from sparkbuild.settings import Settings
from sparkbuild.source import gencodes
from sparkbuild.source.steps import prune
from sparkbuild.spec import Step, load_builds
from tests.support.sglang_releases import ALL_RELEASES

pytestmark = pytest.mark.github

PROJECT = Path(__file__).resolve().parents[1]
RAW = "https://raw.githubusercontent.com/sgl-project/sglang/v{version}/{path}"


def _shipped_steps() -> list[Step]:
    builds = load_builds(Settings(project_dir=PROJECT, cache_dir=PROJECT / ".unused-cache"))
    sglang = next(b for b in builds.values() if b.engine == "sglang")
    return [s for s in sglang.steps if s.step == gencodes.STEP and s.mode == "source"]


def _step_for(version: str) -> Step | None:
    covering = [s for s in _shipped_steps() if SpecifierSet(s.when or "").contains(version)]
    assert len(covering) <= 1, f"{version}: more than one step entry in range"
    return covering[0] if covering else None


RELEASES = [v for v in ALL_RELEASES if _step_for(v) is not None]


@pytest.mark.parametrize("version", RELEASES)
def test_the_shipped_step_leaves_sm_121a_only_in_the_release_file(version: str) -> None:
    step = _step_for(version)
    assert step is not None
    url = RAW.format(version=version, path=step.file)
    with urllib.request.urlopen(url, timeout=60) as response:
        text = response.read().decode("utf-8")
    before = set(gencodes.gencode_archs(text))
    assert before - {"sm_121a"}, f"{url}: already sm_121a only?"
    pruned = prune(step, text)  # raises AnchorDriftError, naming the file, on drift
    assert set(gencodes.gencode_archs(pruned.text)) == {"sm_121a"}, url
    assert pruned.removed_targets == ["flash_ops", "common_ops_sm90_build"]
    assert pruned.removed_includes == ["flashmla.cmake"]
    again = prune(step, pruned.text)
    assert again.text == pruned.text and not again.changed  # idempotent
