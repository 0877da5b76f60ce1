"""A lock too large to read in time is refused before it is read (issue 46, What 4).

`report` on a 40 MB lock was killed after 180 s and `patches` took 150 s and 1.8 GB: reading a
lock costs about 35 times its size in memory. Every command refuses a lock over
``lockfile.LOCK_LIMIT`` by its size, naming the limit and what to do, and no command writes
one. What the commands cost on a lock at the limit is benchmarks/bench_large_lock.py's.

The lock over the limit here is a sparse file: its size is real, its bytes were never
written, and reading it would take the old path (a parse of 16 MiB of NUL bytes).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from sparkbuild import lockfile
from sparkbuild.errors import LockError
from tests.support.gitrepos import Upstream, git, make_upstream
from tests.support.source_project import SourceProject

SPEC = """\
engine: sglang
repo: REPO
package_dir: python/pkg
builds:
  pkg-a:
    ref: v1.0.0
  pkg-b:
    ref: v1.1.0
"""
LIMIT_SAID = "more than the 16 MiB sparkbuild reads or writes for a lock"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return make_upstream(tmp_path_factory.mktemp("upstream"))


@pytest.fixture
def project(tmp_path: Path, upstream: Upstream) -> SourceProject:
    made = SourceProject.create(tmp_path, upstream)
    made.write_spec(SPEC)
    return made


def _oversized(project: SourceProject) -> Path:
    lock = project.root / "images.lock"
    with lock.open("wb") as handle:
        handle.truncate(lockfile.LOCK_LIMIT + 1)  # sparse: nothing is written
    return lock


def _said(result: object) -> str:
    return str(getattr(result, "stderr", "")) + str(getattr(result, "stdout", ""))


def test_every_command_refuses_a_lock_over_the_limit_before_reading_it(
    project: SourceProject, tmp_path: Path
) -> None:
    lock = _oversized(project)
    public = tmp_path / "cosign.pub"
    key = ec.generate_private_key(ec.SECP256R1()).public_key()
    public.write_bytes(key.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    nowhere = "127.0.0.1:9/example/pkg@sha256:" + "ab" * 32  # never asked: the lock fails first
    for args in (
        ["lock", "--check"],
        ["patches", "--locked"],
        ["report", "--out", str(tmp_path / "site")],
        ["verify", nowhere, "--key", str(public)],
    ):
        result = project.run(*args)
        assert result.exit_code != 0, (args, result.output)
        said = _said(result)
        assert f"{lock}: is 16 MiB, {LIMIT_SAID}" in said, (args, said)
        if args[0] != "lock":  # lock --check's own hint is to lock again
            assert "git log -p -- images.lock" in said, (args, said)  # what to do
        assert "127.0.0.1:9" not in said
    assert not (tmp_path / "site").exists()


def test_an_unlocked_patches_run_reads_the_lock_once(project: SourceProject) -> None:
    """Each build read the lock again (50 builds: 50 parses of it); an unlocked run reads it
    once, and notes a lock it cannot use once, not once a build."""
    _oversized(project)
    result = project.run("patches")
    assert result.exit_code == 0, result.output
    assert result.stderr.count("ignoring images.lock for this unlocked run") == 1
    assert LIMIT_SAID in result.stderr


def test_no_command_writes_a_lock_over_the_limit(
    project: SourceProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert project.run("lock", "pkg-a").exit_code == 0
    lock = project.root / "images.lock"
    before = lock.read_bytes()
    monkeypatch.setattr(lockfile, "LOCK_LIMIT", len(before) + 100)  # pkg-b's entry is more
    result = project.run("lock", "pkg-b")
    assert result.exit_code != 0, result.output
    assert "is unchanged: writing it would make it" in result.stderr
    assert lock.read_bytes() == before


def test_a_revision_over_the_limit_is_refused_before_git_shows_it(
    project: SourceProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report's history reads earlier locks from git: sized first, never read whole."""
    assert project.run("lock").exit_code == 0
    git(project.root, "init", "-q", "-b", "main")
    git(project.root, "add", "images.lock")
    git(project.root, "commit", "-q", "-m", "both builds")
    path = project.root / "images.lock"
    lock = lockfile.load(path)
    del lock.builds["pkg-b"]
    lockfile.write_atomic(path, lockfile.dumps(lock))
    limit = path.stat().st_size + 1  # the lock now is under it, the committed one over
    monkeypatch.setattr(lockfile, "LOCK_LIMIT", limit)
    result = project.run("report", "--diff", "pkg-a@HEAD", "pkg-a", "--out", str(tmp_path / "s"))
    assert result.exit_code != 0, result.output
    assert f"{path}: at " in result.stderr, result.stderr
    assert f"more than the {limit} bytes sparkbuild reads or writes" in result.stderr


def test_the_library_refuses_it_too(tmp_path: Path) -> None:
    """``lockfile.load``, what every command reads the lock with."""
    lock = tmp_path / "images.lock"
    lock.write_text("schema: 1\nbuilds: {}\n")
    assert lockfile.load(lock).builds == {}
    os.truncate(lock, lockfile.LOCK_LIMIT + 4096)
    with pytest.raises(LockError, match=LIMIT_SAID):
        lockfile.load(lock)


def test_a_control_character_in_the_lock_is_named_not_an_internal_error(
    project: SourceProject,
) -> None:
    """Found beside the size limit: a NUL byte made the YAML reader fail before the parse's
    own error handling, and every command said "internal error: ReaderError"."""
    (project.root / "images.lock").write_bytes(b"schema: 1\nbuilds:\n  pkg\x00a: {}\n")
    result = project.run("lock", "--check")
    assert result.exit_code == 1, result.output
    assert "images.lock:3: malformed YAML: special characters are not allowed (#x0000)" in (
        result.stderr
    )
    assert "internal error" not in result.stderr
