"""The wheels sparkbuild reads (a release's, for its pins; the kernel packages'), checked
against the sha256 the package index gives for them before a byte of them is read.

pip resolves the requirement without installing anything (``pip install --dry-run
--report``): the report names the file the index offers and its sha256. pip then downloads
that file with the hash required, and it is hashed again here. A cached wheel is used only
through the record of what the index gave (``cachetrust.write_manifest``), and only while its
bytes still hash to it: any other file of that name in the cache is never read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkbuild import cachetrust

_PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]


@dataclass(frozen=True)
class IndexFile:
    """A wheel as the package index offers it: its name and version, file name, address and
    sha256."""

    name: str
    version: str
    file: str
    url: str
    sha256: str

    def to_json(self) -> dict[str, str]:
        return {
            "name": self.name,
            "version": self.version,
            "file": self.file,
            "url": self.url,
            "sha256": self.sha256,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> IndexFile | None:
        """The record as written, or None when it is not one (a field missing, a file name
        with a directory in it)."""
        fields = {k: data.get(k) for k in ("name", "version", "file", "url", "sha256")}
        if not all(isinstance(v, str) and v for v in fields.values()):
            return None
        found = cls(**{k: str(v) for k, v in fields.items()})
        plain = Path(found.file).name == found.file  # a name in the folder, never ../
        return found if plain and found.file.endswith(".whl") else None


def _first_error(stderr: str, returncode: int) -> str:
    lines = [x for x in stderr.splitlines() if x.startswith("ERROR")]
    return lines[0] if lines else f"pip exited {returncode}"


def on_index(requirement: str, pip_args: Sequence[str]) -> IndexFile | str:
    """The wheel the index offers for ``requirement`` (``pip_args``: the platform), with its
    sha256; or why there is none."""
    with tempfile.TemporaryDirectory(prefix="sparkbuild-index-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [*_PIP, "install", "--dry-run", "--ignore-installed", "--no-deps", "--quiet"]
        cmd += ["--only-binary=:all:", "--target", str(Path(tmp) / "target")]
        cmd += ["--report", str(report), *pip_args, requirement]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not report.is_file():
            return _first_error(done.stderr, done.returncode)
        data = json.loads(report.read_text(encoding="utf-8"))
    try:
        (item,) = data["install"]
        url = str(item["download_info"]["url"])
        metadata = item["metadata"]
        sha256 = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
    except (KeyError, TypeError, ValueError):
        return f"pip's report for {requirement} does not name one file"
    file = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    if not sha256:
        return f"the package index gives no sha256 for {file}"
    name, version = metadata.get("name"), metadata.get("version")
    found = IndexFile.from_json(
        {"name": name, "version": version, "file": file, "url": url, "sha256": sha256}
    )
    return found if found is not None else f"the package index offers {file}, not a wheel"


def download(found: IndexFile, pip_args: Sequence[str], into: Path) -> Path | str:
    """``found``'s file in ``into``, downloaded by pip with its sha256 required and hashed
    again here; or why not."""
    with tempfile.TemporaryDirectory(prefix="sparkbuild-index-") as tmp:
        wanted = Path(tmp) / "requirements.txt"
        wanted.write_text(f"{found.name}=={found.version} --hash=sha256:{found.sha256}\n")
        cmd = [*_PIP, "download", "--no-deps", "--only-binary=:all:", "--quiet"]
        cmd += ["--require-hashes", "-d", str(into), *pip_args, "-r", str(wanted)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    path = into / found.file
    if done.returncode != 0 or not path.is_file():
        return _first_error(done.stderr, done.returncode)
    return matches(path, found)


def matches(path: Path, found: IndexFile) -> Path | str:
    """``path`` when it is a regular file whose sha256 is the index's; else why not."""
    if path.is_symlink() or not path.is_file():
        return f"{path.name} is not a regular file"
    actual = cachetrust.sha256_of(path)
    if actual != found.sha256:
        return f"{path.name} has sha256 {actual}, the package index gives {found.sha256}"
    return path


def cached(folder: Path, record: Path) -> IndexFile | None:
    """What the index gave for the wheel ``record`` describes, when that wheel is in
    ``folder`` with those bytes; else None (the record is removed)."""
    manifest = cachetrust.read_manifest(record)
    found = IndexFile.from_json(manifest) if manifest is not None else None
    if found is not None and isinstance(matches(folder / found.file, found), Path):
        return found
    if os.path.lexists(record):
        record.unlink()
    return None


def fetch(requirement: str, pip_args: Sequence[str], folder: Path, record: Path) -> Path | str:
    """``requirement``'s wheel in ``folder``, checked against the index's sha256 (a file
    already there is kept when it matches), and ``record`` written; or why not."""
    found = on_index(requirement, pip_args)
    if isinstance(found, str):
        return found
    target = folder / found.file
    if not isinstance(matches(target, found), Path):
        with tempfile.TemporaryDirectory(dir=folder, prefix=".dl-") as tmp:
            got = download(found, pip_args, Path(tmp))
            if isinstance(got, str):
                return got
            os.replace(got, target)
    cachetrust.write_manifest(record, found.to_json())
    return target


def release(
    cache_dir: Path, engine: str, version: str, pip_args: Sequence[str], purpose: str
) -> Path | str:
    """The ``engine`` ``version`` release's wheel in the cache's private ``wheels/`` as the
    index gives it (``pip_args``: the platform), recorded as ``ENGINE-VERSION.PURPOSE.json``:
    the cached file while its bytes still hash to what the record says the index gave, else
    fetched and checked (any other file of that name is never read); or why not."""
    folder = cachetrust.private_dir(cache_dir / "wheels", "the wheel cache")
    record = folder / f"{engine}-{version}.{purpose}.json"
    found = cached(folder, record)
    if found is not None:
        return folder / found.file
    return fetch(f"{engine}=={version}", pip_args, folder, record)


__all__ = ["IndexFile", "cached", "download", "fetch", "matches", "on_index", "release"]
