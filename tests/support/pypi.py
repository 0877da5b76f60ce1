"""Peers' released packages from PyPI, for tests: a venv holding one pinned release, and one
file of a release's sdist (what its wheel leaves out: docs, sample files)."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
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
    download = target.with_name(target.name + ".download")
    shutil.rmtree(download, ignore_errors=True)
    subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "-q", "download",
         "--no-deps", "--no-binary", ":all:", requirement, "-d", str(download)],
        check=True, capture_output=True,
    )  # fmt: skip
    (archive,) = download.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        top = archive.name.removesuffix(".tar.gz")
        extracted = tar.extractfile(f"{top}/{member}")
        assert extracted is not None, member
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(extracted.read())
    shutil.rmtree(download, ignore_errors=True)
