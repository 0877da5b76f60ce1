"""Peers' released packages from PyPI, for tests: a venv holding one pinned release, and
files of a release's sdist (what its wheel leaves out: docs, sample files, its tests)."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path


def make_venv(base_python: Path, venv: Path, requirement: str) -> None:
    """A venv of ``base_python`` at ``venv`` with ``requirement`` installed."""
    subprocess.run([str(base_python), "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q",
         "install", requirement],
        check=True, capture_output=True,
    )  # fmt: skip


def sdist_member(python: Path, requirement: str, member: str, target: Path) -> None:
    """``member`` (a path inside the sdist, after its top folder) of ``requirement``'s sdist,
    written to ``target``. ``python`` runs pip (one that meets the release's
    Requires-Python)."""
    sdist_members(python, requirement, lambda name: name == member, target.parent)
    kept = target.parent / member
    assert kept.is_file(), member
    if kept != target:
        kept.replace(target)
        for folder in kept.relative_to(target.parent).parents[:-1]:
            (target.parent / folder).rmdir()  # the member's folders, empty now


def sdist_members(
    python: Path, requirement: str, wanted: Callable[[str], bool], folder: Path
) -> list[str]:
    """Every regular file of ``requirement``'s sdist whose path (after its top folder)
    ``wanted`` takes, written under ``folder`` at that path; the paths, sorted."""
    download = folder.with_name(folder.name + ".download")
    shutil.rmtree(download, ignore_errors=True)
    subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "-q", "download",
         "--no-deps", "--no-binary", ":all:", requirement, "-d", str(download)],
        check=True, capture_output=True,
    )  # fmt: skip
    (archive,) = download.glob("*.tar.gz")
    kept: list[str] = []
    with tarfile.open(archive) as tar:
        top = archive.name.removesuffix(".tar.gz") + "/"
        for info in tar.getmembers():
            name = info.name.removeprefix(top)
            if not info.isfile() or not info.name.startswith(top) or ".." in name.split("/"):
                continue
            if wanted(name):
                extracted = tar.extractfile(info)
                assert extracted is not None, name
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).write_bytes(extracted.read())
                kept.append(name)
    shutil.rmtree(download, ignore_errors=True)
    return sorted(kept)
