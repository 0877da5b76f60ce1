"""Outputs never follow a planted link (issue 46, What 3): a symlink where sparkbuild writes a
file (a profile, the lock, a log, JSON) is replaced by the file, one where it writes
a directory (an arena submission) is refused, and nothing is created or changed
at the link's target, a dangling link's included. The report's directories are tested in
tests/test_report.py, a checkout's in tests/test_source_stage.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkbuild import fileio, lockfile, outputs
from sparkbuild.engines.logs import LogBuffer
from sparkbuild.errors import OutputError
from tests.support.cli import RunCli

ROOT = Path(__file__).resolve().parents[1]
RECIPE = Path(__file__).parent / "data" / "recipes" / "qwen3.6-27b-fp8-mtp-vllm.yaml"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the project that a planted link points to."""
    path = tmp_path / "outside" / "victim.txt"
    path.parent.mkdir()
    path.write_text("precious\n")
    return path


def _plant(link: Path, target: Path) -> Path:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return link


@pytest.mark.parametrize("dangling", [False, True])
def test_write_atomic_replaces_a_link_and_leaves_its_target(
    tmp_path: Path, outside: Path, dangling: bool
) -> None:
    target = tmp_path / "outside" / "created.txt" if dangling else outside
    link = _plant(tmp_path / "out.json", target)
    fileio.write_atomic(link, "{}\n")
    assert not link.is_symlink() and link.read_text() == "{}\n"
    assert link.stat().st_mode & 0o777 == 0o644  # not the target's mode
    assert outside.read_text() == "precious\n"
    assert not (tmp_path / "outside" / "created.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "outside"]  # no scratch


def test_replace_dir_replaces_a_link_and_leaves_the_directory_it_points_to(
    tmp_path: Path, outside: Path
) -> None:
    link = _plant(tmp_path / "site", outside.parent)
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "index.html").write_text("new")
    fileio.replace_dir(staging, link)
    assert not link.is_symlink() and (link / "index.html").read_text() == "new"
    assert sorted(p.name for p in outside.parent.iterdir()) == ["victim.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside", "site"]  # the link gone


def test_an_engine_log_replaces_a_link(tmp_path: Path, outside: Path) -> None:
    link = _plant(tmp_path / "logs" / "engine.log", outside)
    logs = LogBuffer(link)
    logs.append("INFO started")
    logs.close()
    assert not link.is_symlink() and link.read_text() == "INFO started\n"
    assert outside.read_text() == "precious\n"


def test_profile_import_force_replaces_a_link_not_the_file_it_points_to(
    run_cli: RunCli, tmp_path: Path, outside: Path
) -> None:
    """Round 4's leftover: `profile import --out LINK --force` wrote the profile into the
    file outside the project."""
    project = tmp_path / "project"
    link = _plant(project / "smoke" / "mine.yaml", outside)
    args = ("--project", str(project), "profile", "import", str(RECIPE), "--out", str(link))
    refused = run_cli(*args)
    assert refused.exit_code == 2 and "exists" in refused.stderr
    done = run_cli(*args, "--force")
    assert done.exit_code == 0, done.output
    assert outside.read_text() == "precious\n"
    assert not link.is_symlink() and "model: Qwen/Qwen3.6-27B-FP8" in link.read_text()


def test_profile_import_refuses_a_dangling_link_without_force(
    run_cli: RunCli, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    elsewhere = tmp_path / "elsewhere.yaml"
    link = _plant(project / "smoke" / f"{RECIPE.stem}.yaml", elsewhere)
    result = run_cli("--project", str(project), "profile", "import", str(RECIPE))
    assert result.exit_code == 2 and "exists" in result.stderr, result.output
    assert not elsewhere.exists() and link.is_symlink()


@pytest.mark.parametrize("dangling", [False, True])
def test_an_arena_link_is_refused_before_boot_and_nothing_is_made_at_its_target(
    run_cli: RunCli, tmp_path: Path, dangling: bool
) -> None:
    """Round 4's leftover: `--arena` followed a dangling link and made the submission at
    its target."""
    target = tmp_path / "elsewhere"
    if not dangling:
        target.mkdir()
    link = _plant(tmp_path / "sub", target)
    result = run_cli("--project", str(ROOT), "bench", "--command", "false",
                     "--profile", "cpu-reference", "--arena", str(link))  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "is a symlink" in result.stderr
    assert (not target.exists()) if dangling else not any(target.iterdir())


def test_json_file_replaces_a_link(tmp_path: Path, outside: Path) -> None:
    link = _plant(tmp_path / "run.json", outside)
    outputs.emit_json({"ok": True}, str(link))
    assert outside.read_text() == "precious\n"
    assert not link.is_symlink() and '"ok": true' in link.read_text()


def test_the_lock_replaces_a_link_at_its_path(tmp_path: Path, outside: Path) -> None:
    link = _plant(tmp_path / "images.lock", outside)
    lockfile.write_atomic(link, "version: 1\n")
    assert outside.read_text() == "precious\n"
    assert not link.is_symlink() and link.read_text() == "version: 1\n"


def test_output_dir_refuses_a_link(tmp_path: Path) -> None:
    link = _plant(tmp_path / "diff", tmp_path / "missing")
    with pytest.raises(OSError, match="is a symlink"):
        fileio.output_dir(link)
    assert not (tmp_path / "missing").exists()


def test_a_project_directory_that_is_a_link_is_never_written_through(
    run_cli: RunCli, tmp_path: Path
) -> None:
    """A project (a cloned one too) may carry links: `smoke/` pointing out of it is not
    where an imported profile goes, unless --out names it."""
    project = tmp_path / "project"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _plant(project / "smoke", elsewhere)
    result = run_cli("--project", str(project), "profile", "import", str(RECIPE))
    assert result.exit_code != 0 and "is a symlink" in result.stderr, result.output
    assert "pass --out" in result.stderr and list(elsewhere.iterdir()) == []
    assert fileio.project_output(project, "images.lock") == project / "images.lock"
    with pytest.raises(OutputError, match="is a symlink"):
        fileio.project_output(project, "smoke/x/y.log")
