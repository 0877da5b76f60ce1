"""Publish's preflight requirement and the lock's preflight section (no Docker needed).

Only a passing preflight run inside the pinned image counts; a local venv run, a failing run
or a run of another image does not, and the refusal names the command that records one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkbuild import lockfile
from sparkbuild.errors import SparkbuildError
from sparkbuild.preflight.gate import preflight_gate, preflight_verdicts
from sparkbuild.settings import Settings
from sparkbuild.spec import load_builds
from tests.support.preflight_lock import record_preflight

IMAGE = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64
SPEC = """\
engine: sglang
repo: https://github.com/sgl-project/sglang.git
package_dir: python/sglang
builds:
  b: {ref: v0.5.12, smoke: [p1, p2]}
"""


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    (tmp_path / "builds").mkdir()
    (tmp_path / "builds" / "sglang.yaml").write_text(SPEC)
    settings = Settings(project_dir=tmp_path, cache_dir=tmp_path / "cache")
    lockfile.set_section(
        settings.lock_file, "b", lockfile.ImageSection(image_id=IMAGE, tree="f" * 40)
    )
    return settings


def test_publish_needs_a_passing_preflight_in_the_pinned_image(settings: Settings) -> None:
    build = load_builds(settings)["b"]
    with pytest.raises(SparkbuildError) as refused:
        preflight_gate(settings, build, IMAGE, force=False)
    assert "p1: missing, p2: missing" in refused.value.message
    assert "sparkbuild preflight b --image IMAGE --record" in str(refused.value.hint)

    record_preflight(settings.lock_file, "b", "p1")
    record_preflight(settings.lock_file, "b", "p2", where="venv")  # proves the tree only
    assert preflight_verdicts(settings, build, IMAGE) == {"p1": "pass", "p2": "missing"}
    with pytest.raises(SparkbuildError):
        preflight_gate(settings, build, IMAGE, force=False)
    assert preflight_gate(settings, build, IMAGE, force=True) is False  # recorded unverified

    record_preflight(settings.lock_file, "b", "p2", "fail")
    assert preflight_verdicts(settings, build, IMAGE)["p2"] == "fail"
    record_preflight(settings.lock_file, "b", "p2")
    assert preflight_gate(settings, build, IMAGE, force=False) is True
    # Another image's runs do not count for this one.
    assert preflight_verdicts(settings, build, OTHER) == {"p1": "missing", "p2": "missing"}
