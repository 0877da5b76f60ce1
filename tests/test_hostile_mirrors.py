"""The caches outside preflight get its trust checks (issue 46, What 3): the mirror cache,
the requirements' wheels and the image build contexts.

A mirror is a bare git repository sparkbuild runs git in; what it resolves there becomes the
pinned source. Each test plants what another user, or a cloned cache, could leave in one:
a config that redirects the upstream (``url.X.insteadOf``), a hook git runs on a ref update,
borrowed objects (``alternates``), another owner, a cache others can write. The planted
mirror is never used: made again by a run that makes mirrors, passed over by one that only
reads the cache, and the verdict (the pinned commit) is the real upstream's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.gitrepos import Upstream, git, make_upstream, tagged_repo
from tests.support.source_project import SourceProject

NOBODY = 65534
SPEC = """\
    engine: sglang
    repo: REPO
    base_branch: main
    package_dir: python/pkg
    builds:
      new:
        ref: v1.1.0
"""


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return make_upstream(tmp_path_factory.mktemp("upstream"))


@pytest.fixture(scope="module")
def impostor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another repository with a v1.1.0 tag: what a redirected mirror would pin."""
    work = tmp_path_factory.mktemp("impostor")
    (work / "python" / "pkg").mkdir(parents=True)
    (work / "python" / "pkg" / "__init__.py").write_text('__version__ = "1.1.0"\n')
    tagged_repo(work, "v1.1.0", "impostor")
    return work


@pytest.fixture
def project(tmp_path: Path, upstream: Upstream) -> SourceProject:
    made = SourceProject.create(tmp_path, upstream)
    made.write_spec(SPEC)
    return made


def _commit(project: SourceProject) -> str:
    result = project.run("lock")
    assert result.exit_code == 0, result.output
    commit: str = project.lock["builds"]["new"]["source"]["commit"]
    return commit


def _mirror(project: SourceProject) -> Path:
    (path,) = (project.cache / "mirrors").glob("*.git")
    return path


def _redirect(mirror: Path, impostor: Path, upstream: Upstream, marker: Path) -> None:
    git(mirror, "config", f"url.{impostor}.insteadOf", upstream.url)


def _hook(mirror: Path, impostor: Path, upstream: Upstream, marker: Path) -> None:
    git(mirror, "update-ref", "-d", "refs/tags/v1.1.0")  # so the next run updates a ref
    hook = mirror / "hooks" / "reference-transaction"
    hook.parent.mkdir(exist_ok=True)
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)


def _alternates(mirror: Path, impostor: Path, upstream: Upstream, marker: Path) -> None:
    (mirror / "objects" / "info").mkdir(exist_ok=True)
    (mirror / "objects" / "info" / "alternates").write_text(f"{impostor}/.git/objects\n")


def _other_owner(mirror: Path, impostor: Path, upstream: Upstream, marker: Path) -> None:
    _redirect(mirror, impostor, upstream, marker)
    for directory, dirs, files in os.walk(mirror):
        for name in [*dirs, *files]:
            os.lchown(Path(directory, name), NOBODY, NOBODY)
    os.lchown(mirror, NOBODY, NOBODY)


def _writable(mirror: Path, impostor: Path, upstream: Upstream, marker: Path) -> None:
    _redirect(mirror, impostor, upstream, marker)
    (mirror / "config").chmod(0o666)


PLANTS: dict[str, Callable[[Path, Path, Upstream, Path], None]] = {
    "redirect": _redirect,
    "hook": _hook,
    "alternates": _alternates,
    "owner": _other_owner,
    "writable": _writable,
}


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's mirror needs root")
@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_planted_mirror_is_made_again_and_never_decides_the_pin(
    project: SourceProject, upstream: Upstream, impostor: Path, tmp_path: Path, plant: str
) -> None:
    real = _commit(project)
    assert real == upstream.tags["v1.1.0"]
    mirror = _mirror(project)
    marker = tmp_path / "hook-ran"
    PLANTS[plant](mirror, impostor, upstream, marker)
    (project.root / "images.lock").unlink()

    result = project.run("lock")

    assert result.exit_code == 0, result.output
    assert project.lock["builds"]["new"]["source"]["commit"] == real
    assert not marker.exists()
    assert "the mirror" in result.stderr and "is not used" in result.stderr
    assert not (mirror / "hooks" / "reference-transaction").exists()
    assert "insteadof" not in (mirror / "config").read_text().lower()
    assert mirror.stat().st_uid == os.geteuid()


def test_lock_check_reads_no_planted_mirror(
    project: SourceProject, impostor: Path, upstream: Upstream
) -> None:
    """`lock --check` only reads the cache: a planted mirror is passed over, said, and left
    as it is (not proven offline), never run in."""
    _commit(project)
    mirror = _mirror(project)
    _redirect(mirror, impostor, upstream, mirror)
    result = project.run("lock", "--check")
    assert result.exit_code == 0, result.output
    assert f"the mirror {mirror} is not used: config sets url." in " ".join(result.stderr.split())
    assert "insteadof" in (mirror / "config").read_text().lower()  # left for the user


def test_a_mirror_cache_others_can_write_is_refused(project: SourceProject) -> None:
    mirrors = project.cache / "mirrors"
    mirrors.mkdir(parents=True)
    mirrors.chmod(0o777)
    result = project.run("lock")
    assert result.exit_code == 1, result.output
    assert f"the mirror cache {mirrors} is writable by group or others" in result.stderr
    assert list(mirrors.iterdir()) == []


def test_a_mirror_sparkbuild_made_passes_its_checks(project: SourceProject) -> None:
    """The allowed config keys are every key a mirror of ours holds, partial or full."""
    from sparkbuild.source.mirror_trust import mirror_problem

    _commit(project)
    mirror = _mirror(project)
    assert mirror_problem(mirror, project.url) is None
    assert mirror_problem(mirror, "https://example.invalid/other.git") is not None
