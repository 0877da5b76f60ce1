"""Hostile and broken input: nothing executes, nothing leaves the project, nothing is
misreported, and every error is one screen without a traceback.

Every case runs the real command line against real git repositories (a local bare upstream
with tags and refs/pull/N/head).
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from sparkbuild.cli import main
from tests.support.gitrepos import Upstream, make_patch, make_upstream


@dataclass
class Project:
    root: Path
    cache: Path
    upstream: Upstream

    def run(self, *args: str, input: str | None = None) -> Result:
        result = CliRunner().invoke(
            main,
            ["--project", str(self.root), "--cache-dir", str(self.cache), "--quiet", *args],
            input=input,
        )
        assert_one_screen(result)
        return result

    def write_spec(self, text: str, repo: str | None = None, name: str = "pkg.yaml") -> Path:
        spec = textwrap.dedent(text).replace("REPO", repo if repo is not None else self.url)
        path = self.root / "builds" / name
        path.write_text(spec)
        return path

    @property
    def url(self) -> str:
        return self.upstream.url

    @property
    def lock_text(self) -> str:
        return (self.root / "images.lock").read_text()


def assert_one_screen(result: Result) -> None:
    """No traceback; a failure exits 1 or 2 with an ``error:`` line on stderr."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"traceback: {result.exception!r}\n{result.output}")
    assert "Traceback" not in result.output
    if result.exit_code != 0:
        assert result.exit_code in (1, 2), result.output
        assert result.stderr.strip(), "a failure must say why on stderr"
        assert len(result.stderr.splitlines()) < 40, result.stderr


SPEC = """\
    engine: sglang
    repo: REPO
    base_branch: main
    package_dir: python/pkg
    prs:
      - {number: 103}
    patches:
      - {file: patches/pkg/applies.patch}
    builds:
      new:
        ref: v1.1.0
"""


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return make_upstream(tmp_path_factory.mktemp("upstream"))


@pytest.fixture
def project(tmp_path: Path, upstream: Upstream) -> Project:
    root = tmp_path / "project"
    (root / "builds").mkdir(parents=True)
    patches = root / "patches" / "pkg"
    patches.mkdir(parents=True)
    (patches / "applies.patch").write_text(
        make_patch(
            upstream.work,
            "v1.1.0",
            {"python/pkg/alpha.py": ("alpha line 20\n", "alpha line 20 (ours)\n")},
            header="What: a local fix.\n",
        )
    )
    proj = Project(root=root, cache=tmp_path / "cache", upstream=upstream)
    proj.write_spec(SPEC)
    return proj


# -- critical: nothing a URL or ref says is ever executed -------------------------------


def _injections(marker: Path) -> list[str]:
    cmd = f"touch {marker}"
    return [
        f"--upload-pack={cmd}",
        f"--upload-pack={cmd};",
        f"-u{cmd}",
        f"--config=core.sshCommand={cmd}",
        f"ext::sh -c {cmd.replace(' ', '% ')}",
        f"ext::{cmd}",
        f"  --upload-pack={cmd}",
        f"\t-u{cmd}",
        f"fd::3,{cmd}",
        f"ssh://-oProxyCommand={cmd.replace(' ', '%20')}/x",
    ]


@pytest.mark.parametrize("index", range(10))
def test_spec_repo_never_runs_a_command(project: Project, tmp_path: Path, index: int) -> None:
    marker = tmp_path / "pwned"
    url = _injections(marker)[index]
    spec = project.write_spec(SPEC, repo=json.dumps(url))
    for command in (["patches"], ["lock"], ["prepare", "new"]):
        result = project.run(*command)
        assert not marker.exists(), f"{command} ran {url!r}"
        assert result.exit_code == 2, result.output
        assert f"{spec}:2: repo:" in result.stderr
    assert not (project.root / "images.lock").exists()


@pytest.mark.parametrize("index", range(10))
def test_repo_option_never_runs_a_command(project: Project, tmp_path: Path, index: int) -> None:
    marker = tmp_path / "pwned"
    url = _injections(marker)[index]
    result = project.run("--repo", f"sglang={url}", "patches")
    assert not marker.exists(), url
    assert result.exit_code == 2
    assert "--repo" in result.stderr


@pytest.mark.parametrize(
    "field, value",
    [
        ("ref", "--upload-pack=touch {marker}"),
        ("ref", "-u touch {marker}"),
        ("ref", "v1.1.0:refs/heads/evil"),
        ("ref", "../../v1.1.0"),
        ("base_branch", "--upload-pack=touch {marker}"),
        ("base_branch", "main:refs/heads/x"),
    ],
)
def test_refs_never_become_options(
    project: Project, tmp_path: Path, field: str, value: str
) -> None:
    marker = tmp_path / "pwned"
    text = SPEC.replace("ref: v1.1.0", f"ref: {json.dumps(value.format(marker=marker))}")
    if field == "base_branch":
        text = SPEC.replace("base_branch: main", f"base_branch: {json.dumps(value)}")
        text = text.replace("{marker}", str(marker))
    project.write_spec(text)
    result = project.run("patches")
    assert result.exit_code == 2
    assert f"{field}:" in result.stderr and "git ref" in result.stderr
    assert not marker.exists()


def test_allowed_url_forms_still_work(project: Project) -> None:
    """A plain path, file:// and a file:// with userinfo all fetch; only the form is checked."""
    for url in (project.url, f"file://{project.url}"):
        project.write_spec(SPEC, repo=url)
        result = project.run("patches", "--json")
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        assert {i["id"]: i["status"] for i in report["builds"][0]["items"]} == {
            "#103": "applied",
            "patches/pkg/applies.patch": "applied",
        }


def test_unknown_engine_in_repo_option_is_refused(project: Project) -> None:
    result = project.run("--repo", f"vlm={project.url}", "patches")
    assert result.exit_code == 2
    assert "unknown engine 'vlm'" in result.stderr
    assert "sglang, vllm" in result.stderr


def _lock(project: Project) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(project.lock_text)
    return data
