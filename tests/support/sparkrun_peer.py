"""sparkrun 0.4.2 from PyPI, in its own venv, asked about recipes and submissions.

sparkrun (spark-arena/sparkrun) is the launcher Spark Arena's recipes and leaderboard run on.
It needs Python >= 3.12, newer than the suite's own, so it gets a venv of its own in the
shared test cache, made once per machine from the first such interpreter found (pyenv's
``~/.pyenv/versions/3.1x*``, or ``python3.1x`` on PATH). Where none exists, its tests skip
and say why (``SPARKRUN_MISSING``).

``ask(requests)`` runs ``tests/support/sparkrun_probe.py`` (our code, calling sparkrun's) in
that venv with telemetry off (``SPARKRUN_NO_TELEMETRY=1``), the hub offline
(``HF_HUB_OFFLINE=1``), a throwaway home, and every proxy pointed at a closed port, so
nothing it does can reach the network or the user's sparkrun configuration.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

from tests.support.cache import build_once, shared_test_cache
from tests.support.pypi import make_venv, sdist_member, sdist_members

SPARKRUN_VERSION = "0.4.2"
PROBE = Path(__file__).with_name("sparkrun_probe.py")
_CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens, a request fails at once


def _interpreters() -> list[Path]:
    found = sorted(Path.home().glob(".pyenv/versions/3.1[2-9]*/bin/python3"))
    found += [Path(p) for n in ("python3.13", "python3.12") if (p := shutil.which(n))]
    return found


@cache
def python312() -> Path | None:
    """The first Python >= 3.12 on this machine, or None."""
    for candidate in _interpreters():
        done = subprocess.run(
            [str(candidate), "-c", "import sys; print(sys.version_info >= (3, 12))"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode == 0 and done.stdout.strip() == "True":
            return candidate
    return None


SPARKRUN_MISSING = (
    f"sparkrun {SPARKRUN_VERSION} needs Python >= 3.12, and none was found "
    "(~/.pyenv/versions/3.12*, python3.12 or python3.13 on PATH)"
)


def sparkrun_python() -> Path | None:
    """The venv's python with ``sparkrun==0.4.2`` (made once, about 90 s), or None."""
    base = python312()
    if base is None:
        return None
    venv = build_once(
        shared_test_cache() / f"sparkrun-{SPARKRUN_VERSION}",
        lambda path: make_venv(base, path, f"sparkrun=={SPARKRUN_VERSION}"),
        f"sparkrun=={SPARKRUN_VERSION}\n{base}\n",
    )
    return venv / "bin" / "python"


def sandbox_env(home: Path) -> dict[str, str]:
    """sparkrun's environment: no telemetry, no hub, no network, a home of its own."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(
        SPARKRUN_NO_TELEMETRY="1", HF_HUB_OFFLINE="1", HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"), XDG_CACHE_HOME=str(home / ".cache"),
        HTTP_PROXY=_CLOSED, HTTPS_PROXY=_CLOSED, http_proxy=_CLOSED, https_proxy=_CLOSED,
        NO_PROXY="", no_proxy="", PYTHONDONTWRITEBYTECODE="1",
    )  # fmt: skip
    return env


def ask(python: Path, requests: list[dict[str, Any]], scratch: Path) -> list[dict[str, Any]]:
    """sparkrun's answers to ``requests`` (see sparkrun_probe.py), one per request."""
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "home").mkdir(exist_ok=True)
    payload = scratch / "requests.json"
    payload.write_text(json.dumps(requests), encoding="utf-8")
    done = subprocess.run(
        [str(python), "-P", str(PROBE), str(payload)], capture_output=True, text=True, check=False,
        env=sandbox_env(scratch / "home"), cwd=scratch, timeout=300,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"sparkrun probe failed ({done.returncode}):\n{done.stderr[-3000:]}")
    reply: dict[str, Any] = json.loads(done.stdout)
    assert reply["sparkrun"] == SPARKRUN_VERSION, reply["sparkrun"]
    answers: list[dict[str, Any]] = reply["answers"]
    return answers


def recipes_md(python: Path) -> str:
    """sparkrun 0.4.2's RECIPES.md (the recipe reference), from its sdist on PyPI (cached):
    the wheel does not carry it. ``python`` is sparkrun's venv (pip there meets its
    Requires-Python)."""
    sdist = build_once(
        shared_test_cache() / f"sparkrun-{SPARKRUN_VERSION}-sdist",
        lambda target: sdist_member(
            python, f"sparkrun=={SPARKRUN_VERSION}", "RECIPES.md", target / "RECIPES.md"
        ),
        f"sparkrun=={SPARKRUN_VERSION} sdist\n",
    )
    return (sdist / "RECIPES.md").read_text(encoding="utf-8")


def _docs_or_fixtures(name: str) -> bool:
    return name.endswith(".md") or name == "tests/conftest.py"


def sparkrun_sources(python: Path) -> Path:
    """sparkrun 0.4.2's own documentation (every Markdown file of its sdist) and its tests'
    shared fixtures (``tests/conftest.py``), from its sdist on PyPI (cached), at their paths
    in the sdist: where its own example recipes are."""

    def extract(target: Path) -> None:
        sdist_members(python, f"sparkrun=={SPARKRUN_VERSION}", _docs_or_fixtures, target)

    return build_once(
        shared_test_cache() / f"sparkrun-{SPARKRUN_VERSION}-sdist-docs",
        extract,
        f"sparkrun=={SPARKRUN_VERSION} sdist: *.md, tests/conftest.py\n",
    )


class Sparkrun:
    """sparkrun 0.4.2, asked through the probe; a test's own scratch directory."""

    def __init__(self, python: Path, scratch: Path) -> None:
        self.python = python
        self.scratch = scratch
        self._asked = 0

    def ask(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self._asked += 1
        return ask(self.python, requests, self.scratch / f"ask-{self._asked}")

    def one(self, request: dict[str, Any]) -> dict[str, Any]:
        (answer,) = self.ask([request])
        return answer


def sparkrun_or_skip(scratch: Path) -> Sparkrun:
    """sparkrun 0.4.2 for a test, or the test skips naming why (no Python >= 3.12)."""
    import pytest

    python = sparkrun_python()
    if python is None:
        pytest.skip(SPARKRUN_MISSING)
    return Sparkrun(python, scratch)
