"""Preflight's caches are trusted only as far as they prove themselves (issue 34: critical,
"preflight runs whatever a cache holds", and the high defects of planted trees and wheels).

Each test plants a hostile cache as another user, or a careless one, would leave it: owned
by another uid (a real one, ``nobody``: the suite runs as root and chowns), writable by
others, a symlink out of the cache, a file changed under its manifest. Preflight refuses it,
or makes it again, and never runs from it: a planted ``bin/python``, ``.pth`` file or
``sitecustomize`` would write a marker file, and the marker is never there.

The venvs here are real venvs made by preflight's own code (``python -m venv``, pip), with a
small wheel standing in for torch so that each is made in seconds; the stand-ins are real
wheels from the package index.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sparkbuild import cachetrust
from sparkbuild.errors import UntrustedCacheError
from sparkbuild.preflight import venv
from sparkbuild.preflight.deps import DependencySet, wheel_requirements
from sparkbuild.preflight.kernels import StandinCache, merged_site
from sparkbuild.preflight.where import release_wheel
from sparkbuild.spec import load_builds
from tests.support.cache import shared_test_cache
from tests.support.cli import RunCli
from tests.support.preflight_env import Project, release_repo
from tests.support.sglang_releases import download_wheel

pytestmark = [
    pytest.mark.upstream,  # the venvs' and stand-ins' wheels come from the package index
    pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's cache needs root"),
]

NOBODY = 65534
TINY_TORCH = ("iniconfig==2.3.0",)  # stands in for torch in the shared base venv
RELEASE = DependencySet("sglang", "0.5.12", ("zipp==3.23.0",), ())
REAL_PACKAGE = "tabulate==0.9.0"  # a CPU dependency of the kernel packages, unpacked whole


@pytest.fixture(autouse=True)
def tiny_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(venv, "TORCH", TINY_TORCH)
    monkeypatch.setattr(venv, "_BASE", "torch-m2-tiny")


@pytest.fixture(scope="module")
def made_venvs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A venv root as preflight makes it: the base venv and a release's venv."""
    root = tmp_path_factory.mktemp("made") / "venvs"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(venv, "TORCH", TINY_TORCH)
        patch.setattr(venv, "_BASE", "torch-m2-tiny")
        venv.ensure_venv(root, RELEASE)
    yield root


@pytest.fixture
def venvs(made_venvs: Path, tmp_path: Path) -> Path:
    """A copy of the made venvs, for one test to plant in."""
    root = tmp_path / "cache" / "preflight-venvs"
    root.parent.mkdir(mode=0o700)
    shutil.copytree(made_venvs, root, symlinks=True)
    return root


def _marker_script(path: Path, marker: Path) -> None:
    path.unlink(missing_ok=True)
    path.write_text(f'#!/bin/sh\ntouch {marker}\nexec /usr/bin/python3 "$@"\n')
    path.chmod(0o755)


def _site(venv_path: Path) -> Path:
    return next((venv_path / "lib").glob("python3*/site-packages"))


def _chown_tree(path: Path, uid: int) -> None:
    for directory, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.lchown(Path(directory, name), uid, uid)
    os.lchown(path, uid, uid)


def _release_dir(root: Path) -> Path:
    return venv.venv_dir(root, RELEASE)


def test_a_venv_cache_another_user_owns_is_refused_and_nothing_runs(
    venvs: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    _marker_script(_release_dir(venvs) / "bin" / "python", marker)
    _chown_tree(venvs, NOBODY)
    with pytest.raises(UntrustedCacheError) as raised:
        venv.ensure_venv(venvs, RELEASE)
    assert f"is owned by uid {NOBODY}, not by you" in raised.value.message
    assert "remove it" in (raised.value.hint or "")
    assert not marker.exists()
    assert (_release_dir(venvs) / "bin" / "python").read_text().startswith("#!/bin/sh")


@pytest.mark.parametrize("where", ["root", "above"])
def test_a_venv_cache_others_can_write_is_refused(venvs: Path, tmp_path: Path, where: str) -> None:
    marker = tmp_path / "ran"
    _marker_script(_release_dir(venvs) / "bin" / "python", marker)
    (venvs if where == "root" else venvs.parent).chmod(0o777 if where == "root" else 0o775)
    with pytest.raises(UntrustedCacheError, match="is writable by group or others"):
        venv.ensure_venv(venvs, RELEASE)
    assert not marker.exists()


def test_a_new_venv_cache_is_private(tmp_path: Path) -> None:
    root = tmp_path / "new" / "cache" / "preflight-venvs"
    assert cachetrust.private_dir(root, "the preflight venv cache") == root
    for level in (root, root.parent, root.parent.parent):
        assert level.stat().st_mode & 0o777 == 0o700


def _python_out(venv_path: Path, marker: Path) -> None:
    outside = marker.parent / "outside-python"
    _marker_script(outside, marker)
    python = venv_path / "bin" / "python"
    python.unlink()
    python.symlink_to(outside)


def _pth(venv_path: Path, marker: Path) -> None:
    (_site(venv_path) / "zz-hostile.pth").write_text(f"import os; open({str(marker)!r}, 'w')\n")


def _startup(venv_path: Path, marker: Path) -> None:
    """What Python runs at startup, before any import: a .pth file and sitecustomize."""
    _pth(venv_path, marker)
    (_site(venv_path) / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w')\n")


def _foreign(venv_path: Path, marker: Path) -> None:
    _marker_script(venv_path / "bin" / "python", marker)
    _chown_tree(venv_path, NOBODY)


def _group_writable(venv_path: Path, marker: Path) -> None:
    _marker_script(venv_path / "bin" / "python3.11", marker)
    venv_path.chmod(0o775)


def _manifest_edited(venv_path: Path, marker: Path) -> None:
    """The .pth planted and the manifest edited to list it, by hand: its digest no longer
    matches."""
    _pth(venv_path, marker)
    manifest = venv_path / "sparkbuild-preflight.json"
    data = json.loads(manifest.read_text())
    data["startup"]["lib/python3.11/site-packages/zz-hostile.pth"] = "0" * 64
    manifest.write_text(json.dumps(data))


def _wrong_hashes(venv_path: Path, marker: Path) -> None:
    """The .pth planted and a well-formed manifest written for it, with hashes that are not
    the planted file's."""
    _pth(venv_path, marker)
    manifest = venv_path / "sparkbuild-preflight.json"
    data = json.loads(manifest.read_text())
    del data["sha256"]
    data["startup"]["lib/python3.11/site-packages/zz-hostile.pth"] = "0" * 64
    cachetrust.write_manifest(manifest, data)


PLANTS: dict[str, Callable[[Path, Path], None]] = {
    "python-symlink-out": _python_out,
    "startup-files": _startup,
    "foreign-owner": _foreign,
    "group-writable": _group_writable,
    "manifest-edited": _manifest_edited,
    "wrong-hashes": _wrong_hashes,
}


@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_hostile_venv_is_made_again_never_run(
    venvs: Path, tmp_path: Path, plant: str, capfd: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "ran"
    target = _release_dir(venvs)
    PLANTS[plant](target, marker)

    made = venv.ensure_venv(venvs, RELEASE)

    assert "is not used" in capfd.readouterr().err
    assert not marker.exists()
    assert made.path == target
    assert not (target / "bin" / "python").resolve().is_relative_to(tmp_path)  # the system's
    done = subprocess.run(
        [made.python, "-c", "import zipp, iniconfig; print(zipp.__file__)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.startswith(str(target)) and not marker.exists()
    assert made.distributions() and "zipp" in made.distributions()


def test_a_hostile_base_venv_is_made_again(venvs: Path, tmp_path: Path) -> None:
    """The shared base venv (torch's) is run too, for its site-packages: checked alike."""
    marker = tmp_path / "ran"
    base = venvs / "torch-m2-tiny"
    _marker_script(base / "bin" / "python", marker)
    shutil.rmtree(_release_dir(venvs))  # made again over the base
    made = venv.ensure_venv(venvs, RELEASE)
    subprocess.run([made.python, "-c", "import iniconfig"], check=True)
    assert not marker.exists()
    assert (base / "bin" / "python").is_symlink()


# --- kernel stand-ins ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def made_standins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("made") / "preflight-kernels"
    got = StandinCache(root).get(REAL_PACKAGE, real=True)
    assert not isinstance(got, str), got
    return root


@pytest.fixture
def standins(made_standins: Path, tmp_path: Path) -> Path:
    root = tmp_path / "cache" / "preflight-kernels"
    root.parent.mkdir(mode=0o700)
    shutil.copytree(made_standins, root, symlinks=True)
    return root


def _folder(root: Path) -> Path:
    (folder,) = [p for p in root.iterdir() if p.name.startswith("tabulate-")]
    return folder


def _module(root: Path) -> Path:
    return _folder(root) / "tabulate" / "__init__.py"


HOSTILE_LINE = "HOSTILE = True\n"


def _edit(root: Path, tmp: Path) -> None:
    with _module(root).open("a") as handle:
        handle.write(HOSTILE_LINE)


def _link_out(root: Path, tmp: Path) -> None:
    outside = tmp / "outside.py"
    outside.write_text(_module(root).read_text() + HOSTILE_LINE)
    _module(root).unlink()
    _module(root).symlink_to(outside)


def _added(root: Path, tmp: Path) -> None:
    (_folder(root) / "tabulate" / "version.py").write_text(HOSTILE_LINE)
    (_folder(root) / "evil.pth").write_text(HOSTILE_LINE)


def _foreign_standin(root: Path, tmp: Path) -> None:
    _edit(root, tmp)
    _chown_tree(_folder(root), NOBODY)


def _standin_manifest(root: Path, tmp: Path) -> None:
    """The module changed and the manifest rewritten whole, with a valid digest, for a
    wheel the index never gave: the manifest's files are not the folder's."""
    _edit(root, tmp)
    ready = _folder(root) / ".sparkbuild-standin.json"
    data = json.loads(ready.read_text())
    del data["sha256"]
    data["wheel"]["sha256"] = "0" * 64
    cachetrust.write_manifest(ready, data)


STANDIN_PLANTS: dict[str, Callable[[Path, Path], None]] = {
    "edited": _edit,
    "symlink-out": _link_out,
    "files-added": _added,
    "foreign-owner": _foreign_standin,
    "wrong-hashes": _standin_manifest,
}


@pytest.mark.parametrize("plant", list(STANDIN_PLANTS))
def test_a_hostile_standin_is_made_again_never_read(
    standins: Path, tmp_path: Path, plant: str, capfd: pytest.CaptureFixture[str]
) -> None:
    STANDIN_PLANTS[plant](standins, tmp_path)
    got = StandinCache(standins).get(REAL_PACKAGE, real=True)
    assert not isinstance(got, str), got
    assert "is not used" in capfd.readouterr().err
    module = got.root / "tabulate" / "__init__.py"
    assert not module.is_symlink() and HOSTILE_LINE not in module.read_text()
    assert not (got.root / "evil.pth").exists()
    assert got.root.stat().st_uid == os.geteuid()


def test_a_standin_cache_others_can_write_is_refused(standins: Path) -> None:
    standins.chmod(0o777)
    with pytest.raises(UntrustedCacheError, match="writable by group or others"):
        StandinCache(standins).get(REAL_PACKAGE, real=True)


def test_a_planted_link_in_the_standins_site_is_made_again(standins: Path, tmp_path: Path) -> None:
    got = StandinCache(standins).get(REAL_PACKAGE, real=True)
    assert not isinstance(got, str)
    site = merged_site(standins, (got,))
    assert site is not None
    outside = tmp_path / "outside.py"
    outside.write_text(HOSTILE_LINE)
    link = site / "tabulate" / "__init__.py"
    link.unlink()
    link.symlink_to(outside)
    (site / "sitecustomize.py").symlink_to(outside)
    again = merged_site(standins, (got,))
    assert again == site
    assert link.resolve() == (got.root / "tabulate" / "__init__.py").resolve()
    assert not (site / "sitecustomize.py").exists()


# --- exported trees and the release's wheel ------------------------------------------------

NAN_PROFILE = """\
engine: sglang
model: google/gemma-4-31B-it
args: [--attention-backend, triton]
env: {SGLANG_ENABLE_NAN_LOGITS_CHECK: "1"}
"""
# What a planted tree adds: 0.5.12 never reads the switch, the planted tree "does".
READS_THE_SWITCH = '\nPLANTED = "SGLANG_ENABLE_NAN_LOGITS_CHECK"\n'


def _env_status(project: Project) -> tuple[str, str]:
    report = project.preflight("b", ["nan"], venv=False, checks=("env",))
    (check,) = [c for p in report.profiles for c in p.checks if c.name == "env"]
    return check.status, check.detail


def _environ_link_out(environ: Path, tmp: Path) -> None:
    outside = tmp / "environ.py"
    outside.write_text(environ.read_text() + READS_THE_SWITCH)
    environ.unlink()
    environ.symlink_to(outside)


def _environ_edited(environ: Path, tmp: Path) -> None:
    with environ.open("a") as handle:
        handle.write(READS_THE_SWITCH)


def _module_added(environ: Path, tmp: Path) -> None:
    (environ.parent / "planted.py").write_text(READS_THE_SWITCH)


@pytest.mark.parametrize(
    "plant", [_environ_edited, _environ_link_out, _module_added], ids=["edited", "link", "added"]
)
def test_a_planted_tree_does_not_change_the_verdict(
    tmp_path: Path, plant: Callable[[Path, Path], None], capfd: pytest.CaptureFixture[str]
) -> None:
    """Issue 34, high: the tree exported for a preflight (``preflight-trees/<tree>``) is
    what the verdict is recorded for; a tree planted there under that name decided it."""
    project = Project(tmp_path / "project", tmp_path / "cache")
    project.write_profile("nan", NAN_PROFILE)
    project.write_builds({"b": {"ref": "v0.5.12"}})
    status, detail = _env_status(project)
    assert status == "fail" and "is never read by this version" in detail
    trees = tmp_path / "cache" / "preflight-trees"
    (tree,) = [p for p in trees.iterdir() if p.is_dir()]
    environ = tree / "python" / "sglang" / "srt" / "environ.py"
    plant(environ, tmp_path)

    assert _env_status(project) == (status, detail)
    assert "the exported tree" in capfd.readouterr().err
    assert not environ.is_symlink() and READS_THE_SWITCH not in environ.read_text()
    assert not (environ.parent / "planted.py").exists()


def _fake_wheel(path: Path, requires: str) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        info = "sglang-0.5.12.dist-info"
        archive.writestr(f"{info}/METADATA", f"Name: sglang\nVersion: 0.5.12\n{requires}\n")
        archive.writestr(f"{info}/RECORD", "")


@pytest.mark.parametrize("record", ["none", "wrong-sha256"])
def test_a_planted_release_wheel_is_never_read(tmp_path: Path, record: str) -> None:
    """Issue 34, high: the release's dependency list came from any
    ``wheels/sglang-VERSION-*.whl`` in the cache. Now only from the file the index gives,
    by its sha256: a planted file of that name (or any other) is never read."""
    project = Project(tmp_path / "project", tmp_path / "cache")
    project.write_builds({"b": {"ref": "v0.5.12"}})
    build = load_builds(project.settings)["b"]
    real = download_wheel("0.5.12", shared_test_cache())
    folder = tmp_path / "cache" / "wheels"
    folder.mkdir(mode=0o700)
    evil = "Requires-Dist: evil-package==6.6.6"
    _fake_wheel(folder / real.name, evil)
    _fake_wheel(folder / "sglang-0.5.12-0evil-py3-none-any.whl", evil)
    if record == "wrong-sha256":
        planted = {"name": "sglang", "version": "0.5.12", "file": real.name,
                   "url": "https://example.invalid/x.whl", "sha256": "0" * 64}  # fmt: skip
        cachetrust.write_manifest(folder / "sglang-0.5.12.preflight.json", planted)

    got = release_wheel(project.settings, build)

    assert got == folder / real.name
    assert cachetrust.sha256_of(got) == cachetrust.sha256_of(real)
    assert not any("evil" in line for line in wheel_requirements(got))
    again = release_wheel(project.settings, build)  # a warm run: the record, no download
    assert again == got


def test_preflight_refuses_a_cache_others_can_write(run_cli: RunCli, tmp_path: Path) -> None:
    """The command, end to end: a --cache-dir others can write is refused before anything
    in it is read or run, naming the directory and what to do."""
    cache = tmp_path / "cache"
    project = Project(tmp_path / "project", cache)
    project.write_builds({"b": {"ref": "v0.5.12"}})
    cache.chmod(0o777)
    result = run_cli(
        "--project", str(project.path), "--cache-dir", str(cache),
        "--repo", f"sglang={release_repo()}", "preflight", "b",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert f"{cache} is writable by group or others (mode 0777): it is not used" in (result.stderr)
    assert "hint: remove it (or make it yours" in result.stderr
    assert not (cache / "wheels").exists() and not (cache / "preflight-venvs").exists()
