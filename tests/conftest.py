from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support import cli
from tests.support.cache import shared_test_cache
from tests.support.sglang_releases import ALL_RELEASES, sglang_release_repo


@pytest.fixture(scope="session")
def test_cache() -> Path:
    """Downloads and slow-to-make artifacts shared across runs (PyPI files, base images)."""
    return shared_test_cache()


@pytest.fixture(scope="session")
def release_repo(test_cache: Path) -> Path:
    """The local SGLang repository with one tagged commit per release (from PyPI wheels):
    what the tests of each shipped patch check out and apply to."""
    return sglang_release_repo(test_cache, ALL_RELEASES)


@pytest.fixture(autouse=True)
def _fast_network_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    # Unreachable remotes are part of the tests; do not wait out real backoff.
    monkeypatch.setenv("SPARKBUILD_NET_ATTEMPTS", os.environ.get("SPARKBUILD_NET_ATTEMPTS", "2"))
    monkeypatch.setenv("SPARKBUILD_NET_BACKOFF", "0")


@pytest.fixture
def run_cli() -> cli.RunCli:
    """``run_cli(*args, cwd=, input=, env=, process=False)`` -> exit_code/stdout/stderr/output.

    The one way a test starts sparkbuild: in-process by default, the installed console
    script with ``process=True`` (see tests/support/cli.py for when that is the point)."""
    return cli.run_cli


GITHUB_PROBE = "https://raw.githubusercontent.com/"
_GITHUB_NOTE = pytest.StashKey[str]()


def _github_unreachable() -> str | None:
    """Why GitHub cannot be read from here (None when it answers at all)."""
    try:
        urllib.request.urlopen(urllib.request.Request(GITHUB_PROBE, method="HEAD"), timeout=10)
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _one_worker_per_file(items)
    _deselect_github(config, items)


def _one_worker_per_file(items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` a file's tests share one worker, so a module fixture (a
    booted engine, a built image) is made once; a ``spread`` file's tests are each a group
    of their own, so they may part (xdist would otherwise keep a module together)."""
    for item in items:
        spread = item.get_closest_marker("spread") is not None
        group = item.nodeid if spread else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """Under ``--dist loadgroup`` every test id a worker collected carries its group; when a
    pytest and xdist pair drops it (pytest-dev/pytest-xdist#1386), files are spread over the
    workers and each boots its engines twice, silently. Stop instead."""
    if node.config.getoption("dist") != "loadgroup":
        return
    ungrouped = [nodeid for nodeid in ids if "@" not in nodeid]
    if ungrouped:
        pytest.exit(
            f"--dist loadgroup is not grouping ({ungrouped[0]} has no @group): this pytest "
            "and pytest-xdist do not work together (pytest-dev/pytest-xdist#1386); "
            "install the test extra's pins: pip install -e '.[test]'",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


def _deselect_github(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`github` tests need GitHub: where it is unreachable they are deselected, never skipped
    or passed, and the summary says how many and why."""
    github = [item for item in items if item.get_closest_marker("github")]
    if not github:
        return
    reason = _github_unreachable()
    if reason is None:
        return
    items[:] = [item for item in items if not item.get_closest_marker("github")]
    config.hook.pytest_deselected(items=github)
    config.stash[_GITHUB_NOTE] = (
        f"{len(github)} github test(s) deselected: {GITHUB_PROBE} is unreachable ({reason}); "
        "they did not run"
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker hands its note to the controller, which writes the summary."""
    note = session.config.stash.get(_GITHUB_NOTE, None)
    workeroutput = getattr(session.config, "workeroutput", None)
    if note and workeroutput is not None:
        workeroutput["github_note"] = note


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    note = getattr(node, "workeroutput", {}).get("github_note")
    if note:
        node.config.stash[_GITHUB_NOTE] = note


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    note = terminalreporter.config.stash.get(_GITHUB_NOTE, None)
    if note:
        terminalreporter.write_sep("=", note, yellow=True)
