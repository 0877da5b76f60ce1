"""Spec validation errors and the lock file's atomicity, on real files."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sparkbuild import lockfile
from sparkbuild.adapters import engine_names
from tests.support.cli import run_cli


def run(project: Path, *args: str) -> tuple[int, str]:
    result = run_cli("--project", str(project), "--quiet", *args)
    return result.exit_code, result.stderr


def spec_project(tmp_path: Path, text: str) -> Path:
    (tmp_path / "builds").mkdir()
    (tmp_path / "builds" / "sglang.yaml").write_text(textwrap.dedent(text))
    return tmp_path


def test_unknown_key_gets_file_line_and_did_you_mean(tmp_path: Path) -> None:
    project = spec_project(
        tmp_path,
        """\
        engine: sglang
        repo: /srv/sglang.git
        package_dir: python/sglang
        builds:
          b1:
            ref: v0.5.12
            pacthes: []
    """,
    )
    code, err = run(project, "patches")
    assert code == 2
    assert f"{project}/builds/sglang.yaml:7: unknown field 'builds.b1.pacthes'" in err
    assert "did you mean 'patches'?" in err


def test_bad_values_are_named(tmp_path: Path) -> None:
    project = spec_project(
        tmp_path,
        """\
        engine: tensorrt
        repo: /srv/x.git
        package_dir: python/sglang
        patches:
          - {file: patches/a.patch, when: "0.5.12+-"}
        builds:
          b1: {ref: main}
    """,
    )
    code, err = run(project, "patches")
    assert code == 2
    known = [repr(name) for name in engine_names()]  # the registry's, in its order
    expected = f"{', '.join(known[:-1])} or {known[-1]}"
    assert f"sglang.yaml:1: engine: Input should be {expected}" in err
    assert "sglang.yaml:5: patches[0].when" in err and "is not a version range" in err


def test_version_needed_when_ref_has_none(tmp_path: Path) -> None:
    project = spec_project(
        tmp_path,
        """\
        engine: vllm
        repo: /srv/x.git
        package_dir: vllm
        builds:
          nightly: {ref: main}
    """,
    )
    code, err = run(project, "patches")
    assert code == 2
    assert "builds.nightly.version: cannot parse a version from ref 'main'" in err


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    project = spec_project(tmp_path, "engine: sglang\nbuilds:\n  b1: {ref: v1\n")
    code, err = run(project, "lock")
    assert code == 2
    assert "sglang.yaml:" in err and "malformed YAML" in err


def test_killed_lock_writer_leaves_a_whole_lock(tmp_path: Path) -> None:
    path = tmp_path / "images.lock"
    lockfile.set_section(path, "b1", lockfile.SourceSection(commit="a" * 40))
    writer = (
        "import pathlib, sys\n"
        "from sparkbuild.lockfile import LockedPatch, SourceSection, set_section\n"
        "path = pathlib.Path(sys.argv[1])\n"
        "blob = [LockedPatch(file='x' * 1000)] * 5000\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    set_section(path, 'b1', SourceSection(commit='b' * 40, patches=blob))\n"
        "    set_section(path, 'b1', SourceSection(commit='c' * 40, patches=blob))\n"
    )
    child = subprocess.Popen([sys.executable, "-c", writer, str(path)], stdout=subprocess.PIPE)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == b"ready"
    time.sleep(1.5)  # let it be in the middle of some write
    child.send_signal(signal.SIGKILL)
    child.wait()
    commit = lockfile.load(path).to_json()["builds"]["b1"]["source"]["commit"]
    assert commit in {"a" * 40, "b" * 40, "c" * 40}


def test_failed_mutation_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "images.lock"
    lockfile.set_section(path, "b1", lockfile.ImageSection(image_id="sha256:1"))
    before = path.read_text()

    def explode(entry: lockfile.BuildEntry) -> None:
        entry.image = lockfile.ImageSection(image_id="sha256:2")
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError):
        lockfile.update_entry(path, "b1", explode)
    assert path.read_text() == before
    assert not list(tmp_path.glob(".images.lock.*.tmp"))


def test_lock_is_canonical(tmp_path: Path) -> None:
    path = tmp_path / "images.lock"
    # cuda_code is the lock's one free-form mapping (what the built cubins target)
    lockfile.set_section(path, "zeta", lockfile.ImageSection(cuda_code={"b": 1, "a": 2}))
    lockfile.set_section(path, "alpha", lockfile.ImageSection(cuda_code={"y": [3, 1], "x": None}))
    text = path.read_text()
    assert text.index("alpha:") < text.index("zeta:")
    assert text.index("a: 2") < text.index("b: 1")
    assert lockfile.dumps(lockfile.load(path)) == text
