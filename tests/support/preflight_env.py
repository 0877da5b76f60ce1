"""Projects and venvs for preflight tests against the real SGLang release files.

A test project gets the shipped ``patches/`` and ``smoke/`` (or profile files of its own) and
a ``builds/sglang.yaml`` written by the test; its SGLang repository is the local git
repository of real releases (tests/support/sglang_releases.py). Preflight venvs live in the
shared test cache (``preflight-venvs/``) with one venv per distinct dependency set, and the
shared torch base venv, so every test run after the first reuses them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from sparkbuild.preflight import PreflightReport, Where, run_preflight
from sparkbuild.settings import Settings
from sparkbuild.source import prepare_source
from sparkbuild.spec import load_builds
from tests.support.cache import shared_test_cache
from tests.support.sglang_releases import ALL_RELEASES, download_wheel, sglang_release_repo

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
        if venv:
            chosen = Where(
                venv_root=venv_root(),
                wheel=download_wheel(str(spec.version), shared_test_cache()),
                **where,
            )
        else:
            import sys

            chosen = Where(python=Path(sys.executable), tree=True, **where)
        return run_preflight(self.settings, prepared, profiles, chosen)
