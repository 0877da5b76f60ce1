"""Offline, sparkbuild fails fast and the same way: a host that does not resolve, or refuses
the connection, is not retried and not asked again in the same run; each URL's cause is
named once; ``--json`` has one shape for one build or many; no empty table is printed.

The hosts are real and unreachable for real: names under ``.invalid`` (RFC 2606: never
resolves) and a loopback port nothing listens on. A ``git`` on PATH that logs each call
before running the real one counts what was asked of the network.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from pathlib import Path

import pytest
import yaml

from tests.support.cli import RunCli
from tests.support.gitrepos import tagged_repo

NOWHERE = "https://git.sparkbuild-test.invalid"
# A retry would wait SPARKBUILD_NET_BACKOFF x (1, 2, 4) s: 70 s for three, per build.
SLOW_RETRIES = {"SPARKBUILD_NET_ATTEMPTS": "4", "SPARKBUILD_NET_BACKOFF": "10"}


def _spec(project: Path, engine: str, repo: str, builds: list[str], **extra: object) -> None:
    spec = {
        "engine": engine,
        "repo": repo,
        "package_dir": f"python/{engine}",
        **extra,
        "builds": {name: {"ref": "v1.0.0"} for name in builds},
    }
    (project / "builds").mkdir(parents=True, exist_ok=True)
    (project / "builds" / f"{engine}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def _logging_git(tmp: Path) -> tuple[dict[str, str], Path]:
    """An environment whose ``git`` logs its arguments, one line per call, then runs git."""
    real = next(
        str(Path(d) / "git")
        for d in os.environ["PATH"].split(os.pathsep)
        if (Path(d) / "git").is_file()
    )
    folder, log = tmp / "bin", tmp / "git-calls.log"
    folder.mkdir()
    wrapper = folder / "git"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", **SLOW_RETRIES}, log


def _local_upstream(tmp_path: Path) -> Path:
    """A one-commit SGLang-shaped repository on this machine, tagged v1.0.0."""
    upstream = tmp_path / "upstream"
    (upstream / "python" / "sglang").mkdir(parents=True)
    (upstream / "python" / "sglang" / "__init__.py").write_text("")
    tagged_repo(upstream, "v1.0.0", "release")
    return upstream


def _locked_project(run_cli: RunCli, tmp_path: Path) -> list[str]:
    """A project whose build ``one`` is locked from a local upstream; its global options."""
    project = tmp_path / "project"
    _spec(project, "sglang", str(_local_upstream(tmp_path)), ["one"])
    common = ["--project", str(project), "--cache-dir", str(tmp_path / "c")]
    assert run_cli(*common, "lock").exit_code == 0
    return common


def _remote_calls(log: Path) -> list[str]:
    calls = log.read_text().splitlines() if log.exists() else []
    return [c for c in calls if {"ls-remote", "fetch"} & set(c.split())]


@pytest.fixture
def offline_project(tmp_path: Path) -> Path:
    """Three SGLang builds on one unresolvable URL, one vLLM build on another of its host."""
    project = tmp_path / "project"
    _spec(project, "sglang", f"{NOWHERE}/sgl-project/sglang.git", ["sg-a", "sg-b", "sg-c"])
    _spec(project, "vllm", f"{NOWHERE}/vllm-project/vllm.git", ["vl-a"])
    return project


def test_patches_offline_names_each_url_once_and_asks_each_host_once(
    run_cli: RunCli, offline_project: Path, tmp_path: Path
) -> None:
    env, log = _logging_git(tmp_path)
    began = time.monotonic()

    result = run_cli("--project", str(offline_project), "--cache-dir", str(tmp_path / "c"),
                     "patches", env=env)  # fmt: skip

    took = time.monotonic() - began
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    host = "git.sparkbuild-test.invalid"
    assert errors == [
        f"error: sg-a: cannot list refs of {NOWHERE}/sgl-project/sglang.git: {host} does not "
        "resolve (no DNS answer for its name) (not retried)",
        f"error: vl-a: cannot list refs of {NOWHERE}/vllm-project/vllm.git: {host} does not "
        "resolve (no DNS answer for its name) (found earlier in this run; not asked again)",
        "error: 4 builds could not be prepared: sg-a, sg-b, sg-c, vl-a",
    ], result.stderr
    assert result.stderr.count("hint:") == 1
    assert "--repo ENGINE=PATH" in result.stderr
    assert result.stdout == ""  # no header-only table beside the errors
    assert len(_remote_calls(log)) == 1, _remote_calls(log)  # one question for the host
    assert took < 60, took  # one retry alone would have waited 10 s, three 70 s


def test_a_refused_connection_is_not_retried_either(run_cli: RunCli, tmp_path: Path) -> None:
    with socket.socket() as probe:  # a loopback port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    project = tmp_path / "project"
    _spec(project, "sglang", f"http://127.0.0.1:{port}/sglang.git", ["one", "two"])
    env, log = _logging_git(tmp_path)

    result = run_cli("--project", str(project), "--cache-dir", str(tmp_path / "c"),
                     "patches", env=env)  # fmt: skip

    assert result.exit_code == 1, result.output
    cause = "accepts no connection (refused, or no route to it)"  # curl's words for it
    assert f"127.0.0.1:{port} {cause} (not retried)" in result.stderr
    assert "found earlier in this run; not asked again" not in result.stderr  # one URL: once
    assert result.stderr.count(f"http://127.0.0.1:{port}/sglang.git") == 1, result.stderr
    assert len(_remote_calls(log)) == 1


def test_a_new_run_asks_the_host_again(
    run_cli: RunCli, offline_project: Path, tmp_path: Path
) -> None:
    env, log = _logging_git(tmp_path)
    for _ in range(2):
        run_cli("--project", str(offline_project), "--cache-dir", str(tmp_path / "c"),
                "patches", "sg-a", env=env)  # fmt: skip
    assert len(_remote_calls(log)) == 2


@pytest.mark.parametrize("names", [["sg-a"], ["sg-a", "vl-a"]], ids=["one", "many"])
def test_patches_json_has_one_shape_for_one_build_or_many(
    run_cli: RunCli, offline_project: Path, tmp_path: Path, names: list[str]
) -> None:
    result = run_cli("--project", str(offline_project), "--cache-dir", str(tmp_path / "c"),
                     "patches", "--json", *names, env=SLOW_RETRIES)  # fmt: skip

    assert result.exit_code == 1, result.output
    payload = json.loads(result.stdout)
    assert set(payload) == {"builds", "failed"}
    assert payload["builds"] == []
    assert [f["build"] for f in payload["failed"]] == names
    assert all(set(f) == {"build", "error", "hint"} for f in payload["failed"])
    assert "does not resolve" in payload["failed"][0]["error"]


def test_patches_json_on_success_has_the_same_shape(run_cli: RunCli, tmp_path: Path) -> None:
    upstream = _local_upstream(tmp_path)
    project = tmp_path / "project"
    _spec(project, "sglang", str(upstream), ["local"])

    result = run_cli("--project", str(project), "--cache-dir", str(tmp_path / "c"),
                     "patches", "--json", "local")  # fmt: skip

    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert set(payload) == {"builds", "failed"} and payload["failed"] == []
    assert [b["build"] for b in payload["builds"]] == ["local"]


def test_build_offline_fails_once_per_url(
    run_cli: RunCli, offline_project: Path, tmp_path: Path
) -> None:
    """`nox -s build-sglang` runs `sparkbuild build --engine sglang`: its three builds share
    one URL, asked once."""
    env, log = _logging_git(tmp_path)
    result = run_cli("--project", str(offline_project), "--cache-dir", str(tmp_path / "c"),
                     "build", "--engine", "sglang", env=env)  # fmt: skip

    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2, result.stderr  # the URL once, then the summary
    assert "does not resolve" in errors[0]
    assert errors[1] == "error: 3 of 3 builds failed: sg-a, sg-b, sg-c"
    assert len(_remote_calls(log)) == 1


@pytest.mark.docker
def test_an_unreachable_registry_is_named_as_such_not_as_a_wrong_image(
    run_cli: RunCli, tmp_path: Path
) -> None:
    upstream = _local_upstream(tmp_path)
    project = tmp_path / "project"
    base = "registry.sparkbuild-test.invalid/sglang:v1.0.0"
    _spec(project, "sglang", str(upstream), ["one", "two"], base_image=base)

    result = run_cli("--project", str(project), "--cache-dir", str(tmp_path / "c"), "build",
                     env=SLOW_RETRIES)  # fmt: skip

    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors[0] == (
        f"error: one: cannot reach the registry of base image {base}: "
        "registry.sparkbuild-test.invalid does not resolve (no DNS answer for its name) "
        "(not retried)"
    ), result.stderr
    assert errors[1:] == ["error: 2 of 2 builds failed: one, two"], result.stderr
    assert "not found" not in result.stderr
    assert "the image may well exist" in result.stderr


def test_lock_check_without_the_repo_it_was_locked_from_names_that_mirror(
    run_cli: RunCli, tmp_path: Path
) -> None:
    """Locked offline from a local repository with --repo; checked without it: the pinned
    commits are in the cache, under the local repository's mirror, not the spec's URL."""
    upstream = _local_upstream(tmp_path)
    project = tmp_path / "project"
    _spec(project, "sglang", f"{NOWHERE}/sgl-project/sglang.git", ["one"])
    common = ["--project", str(project), "--cache-dir", str(tmp_path / "c")]
    assert run_cli(*common, "--repo", f"sglang={upstream}", "lock").exit_code == 0

    unproven = run_cli(*common, "lock", "--check")

    assert unproven.exit_code == 0, unproven.output
    said = " ".join(unproven.stderr.split())
    assert f"The pinned commits are in the cache's mirror of {upstream}" in said, said
    assert f"`sparkbuild --repo sglang={upstream} lock --check` proves them" in said
    proven = run_cli(*common, "--repo", f"sglang={upstream}", "lock", "--check")
    assert proven.exit_code == 0, proven.output
    assert "not proven offline" not in proven.stderr


def test_report_attach_names_a_build_that_is_not_in_the_lock(
    run_cli: RunCli, tmp_path: Path
) -> None:
    common = _locked_project(run_cli, tmp_path)
    run = str(Path(__file__).resolve().parents[1] / "benchmarks" / "cpu-reference.json")

    result = run_cli(*common, "report", "--attach", f"two={run}", "--out", str(tmp_path / "r"))

    assert result.exit_code == 2, result.output
    assert f"--attach two={run}: no build 'two' in the lock" in result.stderr
    assert "name one of: one" in result.stderr
    assert not (tmp_path / "r").exists()


def test_a_lock_without_images_reports_the_next_commands_not_empty_tables(
    run_cli: RunCli, tmp_path: Path
) -> None:
    """What an offline lock gives (no image yet): the build page names the smoke command as
    it names the image's, and a diff says neither side has an image instead of a table of
    dashes."""
    common = _locked_project(run_cli, tmp_path)

    site = run_cli(*common, "report", "--out", str(tmp_path / "site"))
    diff = run_cli(*common, "report", "--diff", "one", "one", "--out", str(tmp_path / "diff"))

    assert site.exit_code == 0 and diff.exit_code == 0, site.output + diff.output
    page = (tmp_path / "site" / "builds" / "one.html").read_text()
    assert "Not built: <code>sparkbuild build one</code>" in page
    assert "<code>sparkbuild smoke --image IMAGE --profile P --record one</code>" in page
    (diff_page,) = (tmp_path / "diff").rglob("*.html")
    text = diff_page.read_text()
    assert "Neither side has an image yet: <code>sparkbuild build one</code>" in text
    assert (
        'id="image-fields"><thead>' not in text
        and '<table class="data sides" id="image-fields"' not in text
    )


@pytest.mark.parametrize("names", [["sg-a"], ["sg-a", "sg-b"]], ids=["one", "many"])
def test_build_json_has_one_shape_for_one_build_or_many(
    run_cli: RunCli, offline_project: Path, tmp_path: Path, names: list[str]
) -> None:
    result = run_cli("--project", str(offline_project), "--cache-dir", str(tmp_path / "c"),
                     "build", "--json", *names)  # fmt: skip

    assert result.exit_code == 1, result.output
    payload = json.loads(result.stdout)
    assert payload["results"] == [] and [f["build"] for f in payload["failed"]] == names
    assert "does not resolve" in payload["failed"][0]["error"]


def test_a_commit_locked_from_a_local_mirror_gets_no_upstream_link(
    run_cli: RunCli, tmp_path: Path
) -> None:
    """Its page on the spec's host may not exist: the cache shows the commit came from the
    local repository (--repo), not from the spec's URL."""
    upstream = _local_upstream(tmp_path)
    project = tmp_path / "project"
    _spec(project, "sglang", f"{NOWHERE}/sgl-project/sglang.git", ["one"])
    common = ["--project", str(project), "--cache-dir", str(tmp_path / "c")]
    assert run_cli(*common, "--repo", f"sglang={upstream}", "lock").exit_code == 0
    commit = yaml.safe_load((project / "images.lock").read_text())["builds"]["one"]["source"][
        "commit"
    ]

    result = run_cli(*common, "report", "--out", str(tmp_path / "site"))

    assert result.exit_code == 0, result.output
    page = (tmp_path / "site" / "builds" / "one.html").read_text()
    assert f"<dd>{commit}</dd>" in page, page[:3000]
    assert "/commit/" not in page
