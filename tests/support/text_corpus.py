"""Real, well-formed text the long-text judge must pass: Markdown with tables, lists,
headings, rules and code blocks, source code, JSON, CSV and reference prose.

Read at test time, never copied into the repository:

- this repository's own docs (``README.md``, ``CONTRIBUTING.md``, ``docs/*.md``);
- Markdown from packages' own docs on PyPI: the ``docs/`` of the mkdocs and
  pymdown-extensions sdists (downloaded once per machine into the shared test cache), and
  the Markdown long description of every distribution installed beside the tests;
- source code: this repository's ``src/`` and a few standard-library packages;
- JSON: the repository's JSON files, and every installed distribution's metadata as JSON
  (whole, cut in half, and as JSON lines);
- CSV: the same metadata written by the ``csv`` module;
- Python's own reference manual, ``pydoc_data.topics`` (parallel sentences 0.77-0.96
  alike, and whole sentences repeated a few sentences apart).

Left out, and why: license files (``LICENSE.md`` quotes the same license twice, verbatim:
exactly what a loop looks like).
"""

from __future__ import annotations

import csv
import importlib.metadata
import io
import json
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

from tests.support.cache import build_once, shared_test_cache

__all__ = ["SDISTS", "corpus"]

REPO = Path(__file__).resolve().parents[2]
#: Packages whose sdists carry their Markdown docs.
SDISTS = ("mkdocs==1.6.1", "pymdown-extensions==10.16")
_STDLIB = ("json", "email", "http", "asyncio", "importlib")


def _download(folder: Path) -> None:
    folder.mkdir(parents=True)
    for package in SDISTS:
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
        argv = [*pip, "download", "--no-deps", "--no-binary", ":all:", "-d", str(folder / "sdist")]
        argv.append(package)
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"pip download {package} failed:\n{done.stderr[-2000:]}")
    for archive in sorted((folder / "sdist").glob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".md")]
            tar.extractall(folder / "md", members=members, filter="data")


def _package_docs() -> dict[str, str]:
    folder = build_once(shared_test_cache() / "markdown-docs-v1", _download)
    return {
        f"sdist:{path.relative_to(folder / 'md')}": path.read_text(encoding="utf-8")
        for path in sorted((folder / "md").rglob("*.md"))
        if "LICENSE" not in path.name.upper()
    }


def _descriptions() -> dict[str, str]:
    out = {}
    for dist in importlib.metadata.distributions():
        meta = dist.metadata
        body = meta.get_payload() or ""  # type: ignore[attr-defined]
        if "markdown" in _field(meta, "Description-Content-Type") and len(body) > 500:
            out[f"pypi:{meta['Name']}"] = body
    return out


def _field(meta: importlib.metadata.PackageMetadata, key: str) -> str:
    return str((meta.get_all(key) or [""])[0])


def _metadata_records() -> list[dict[str, str]]:
    return [
        {key: _field(dist.metadata, key) for key in ("Name", "Version", "Summary")}
        for dist in sorted(importlib.metadata.distributions(), key=lambda d: d.metadata["Name"])
    ]


def _csv(records: list[dict[str, str]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(records[0]))
    writer.writeheader()
    writer.writerows(records)
    return out.getvalue()


def _files(root: Path, pattern: str, label: str) -> dict[str, str]:
    return {
        f"{label}:{path.relative_to(root)}": path.read_text(encoding="utf-8")
        for path in sorted(root.glob(pattern))
        if path.is_file()
    }


def corpus() -> dict[str, str]:
    """Every document, by a name that says where it came from."""
    import pydoc_data.topics

    docs = {"repo:README.md": (REPO / "README.md").read_text(encoding="utf-8")}
    docs["repo:CONTRIBUTING.md"] = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    docs |= _files(REPO, "docs/*.md", "repo")
    docs |= _package_docs() | _descriptions()
    docs |= _files(REPO, "src/**/*.py", "repo") | _files(REPO, "src/**/*.json", "repo")
    docs |= _files(REPO, "tests/data/**/*.json", "repo")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for package in _STDLIB:
        docs |= _files(stdlib, f"{package}/*.py", "stdlib")
    records = _metadata_records()
    whole = json.dumps(records, indent=2)
    docs["json:distributions"] = whole
    # JSON a model is still writing (cut) and JSON lines are read as text, not as data.
    docs["json:distributions, cut"] = whole[: len(whole) // 2]
    docs["jsonl:distributions"] = "\n".join(json.dumps(record) for record in records)
    docs["csv:distributions"] = _csv(records)
    docs |= {f"pydoc:{name}": text for name, text in pydoc_data.topics.topics.items()}
    return docs
