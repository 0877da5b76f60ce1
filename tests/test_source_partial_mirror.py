"""Partial-clone mirrors (``--filter=blob:none``) on real repositories served with and without
``uploadpack.allowFilter``: every command gives what a full mirror gives, the mirror really
lacks file contents, a remote that refuses filters gets a full fetch (said once), mirrors made
before partial clones keep working, and a URL with credentials is never stored."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from sparkbuild import git as sb_git
from sparkbuild.source.mirror import Mirror, _shorten, is_partial
from tests.support.bump_repos import make_demo_project, make_demo_upstream
from tests.support.cli import run_cli
from tests.support.gitrepos import Upstream, git, make_patch, make_upstream
from tests.support.source_project import SourceProject

SPEC = """\
    engine: sglang
    repo: REPO
    base_branch: main
    package_dir: python/pkg
    prs:
      - {number: 101}
      - {number: 102}
      - {number: 103}
      - {number: 104, when: ">=1.1"}
      - {number: 106}
    patches:
      - {file: patches/pkg/gamma.patch}
      - {file: patches/pkg/alpha-old.patch, when: "<1.1"}
    builds:
      old:
        ref: v1.0.0
      new:
        ref: v1.1.0
      head:
        ref: main
        version: "1.2.0.dev0"
        prs: [{number: 105}]
"""


def _serve(upstream: Upstream, root: Path, *, filters: bool) -> Upstream:
    """A bare copy of ``upstream`` that allows filtered fetches, or (as git's default) not."""
    bare = root / ("filtered.git" if filters else "plain.git")
    git(root, "clone", "-q", "--mirror", str(upstream.bare), str(bare))
    if filters:
        git(bare, "config", "uploadpack.allowFilter", "true")
    return Upstream(bare=bare, work=upstream.work, tags=upstream.tags, prs=upstream.prs)


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Upstream]:
    root = tmp_path_factory.mktemp("partial")
    upstream = make_upstream(root)
    return {
        "partial": _serve(upstream, root, filters=True),
        "full": _serve(upstream, root, filters=False),
    }


def _project(tmp_path: Path, upstream: Upstream, name: str) -> SourceProject:
    project = SourceProject.create(tmp_path / name, upstream)
    work = upstream.work
    project.patches.joinpath("gamma.patch").write_text(
        make_patch(work, "v1.0.0", {"python/pkg/gamma.py": ("gamma line 7\n", "gamma 7 (ours)\n")})
    )
    project.patches.joinpath("alpha-old.patch").write_text(
        make_patch(
            work, "v1.0.0", {"python/pkg/alpha.py": ("alpha line 20\n", "alpha 20 (ours)\n")}
        )
    )
    project.write_spec(SPEC)
    return project


def _mirror(project: SourceProject) -> Path:
    (mirror,) = (project.cache / "mirrors").glob("*.git")
    return mirror


def _filter(mirror: Path) -> str:
    """The filter the mirror fetches with ('' when it fetches everything)."""
    return (
        sb_git.run(
            ["config", "--get", "remote.origin.partialCloneFilter"], git_dir=mirror, check=False
        )
        .stdout.decode()
        .strip()
    )


def _missing(mirror: Path) -> int:
    listed = git(mirror, "rev-list", "--objects", "--all", "--missing=print")
    return sum(1 for line in listed.splitlines() if line.startswith("?"))


def _settled(project: SourceProject) -> dict[str, Any]:
    result = project.run("patches", "--json")
    payload: dict[str, Any] = json.loads(result.stdout)
    return {
        build["build"]: {
            "tree": build["tree"],
            "items": [(i["id"], i["status"], i["detail"]) for i in build["items"]],
        }
        for build in payload["builds"]
    }


def test_a_partial_mirror_settles_prepares_locks_and_proves_like_a_full_one(
    upstreams: dict[str, Upstream], tmp_path: Path
) -> None:
    partial = _project(tmp_path, upstreams["partial"], "partial")
    full = _project(tmp_path, upstreams["full"], "full")
    settled = _settled(partial)
    assert settled == _settled(full)
    assert settled["new"]["items"][0][1] == "upstream"  # #101, by its merge commit
    assert {status for _, status, _ in settled["head"]["items"]} >= {"applied", "conflict"}
    # Really partial: commits and trees only, plus the contents that were applied or diffed.
    assert is_partial(_mirror(partial)) and _filter(_mirror(partial)) == "blob:none"
    assert _filter(_mirror(full)) == ""  # the server refused: everything came
    lacking = _missing(_mirror(partial))
    assert lacking > 0 and _missing(_mirror(full)) == 0

    out = tmp_path / "tree"
    prepared = partial.run("prepare", "new", "--out", str(out))
    assert prepared.exit_code == 0, prepared.output
    assert prepared.stdout.strip() == settled["new"]["tree"]
    assert "gamma 7 (ours)" in (out / "python/pkg/gamma.py").read_text()
    assert git(out, "status", "--porcelain") == ""
    assert _missing(_mirror(partial)) < lacking  # the checkout fetched what it reads

    for project in (partial, full):
        assert project.run("lock", "old", "new").exit_code == 0
        assert project.run("prepare", "--locked", "new").exit_code == 0
        checked = project.run("lock", "--check", "old", "new")
        assert checked.exit_code == 0, checked.output
    # The same pins, whichever mirror (the repo URL, and so the spec digest, differ).
    pinned = ("commit", "tree", "prs", "patches")
    for build in ("old", "new"):
        sources = [p.lock["builds"][build]["source"] for p in (partial, full)]
        assert [{k: s[k] for k in pinned} for s in sources] == [
            {k: sources[1][k] for k in pinned}
        ] * 2


def test_offline_proof_never_fetches_and_says_when_contents_are_missing(
    upstreams: dict[str, Upstream], tmp_path: Path
) -> None:
    project = _project(tmp_path, upstreams["partial"], "offline")
    assert project.run("lock", "old", "new").exit_code == 0
    checked = project.run("lock", "--check", "old", "new")
    assert checked.exit_code == 0, checked.output
    # A new cache whose mirror only ever settled "new": the contents "old" patches are absent.
    shutil.rmtree(project.cache)
    assert project.run("patches", "new").exit_code == 0
    lacking = _missing(_mirror(project))
    checked = run_cli(
        *("--project", str(project.root), "--cache-dir", str(project.cache)),
        *("lock", "--check", "old", "new"),
    )
    assert checked.exit_code == 0, checked.output
    assert "old: commit and tree not re-derived (the local mirror lacks file contents" in (
        checked.stderr
    )
    assert "new: commit and tree not re-derived" not in checked.stderr  # proven offline
    assert _missing(_mirror(project)) == lacking  # nothing was fetched


def test_a_remote_that_refuses_filters_gets_a_full_fetch_said_once(
    upstreams: dict[str, Upstream], tmp_path: Path
) -> None:
    project = _project(tmp_path, upstreams["full"], "refused")
    args = ("--project", str(project.root), "--cache-dir", str(project.cache), "patches", "new")
    first = run_cli(*args)
    assert first.exit_code == 0, first.output
    assert first.stderr.count("does not allow partial fetches (uploadpack.allowFilter)") == 1
    second = run_cli(*args)
    assert second.exit_code == 0 and "allowFilter" not in second.stderr
    assert _missing(_mirror(project)) == 0 and _filter(_mirror(project)) == ""


def test_a_mirror_made_before_partial_clones_stays_full_and_works(
    upstreams: dict[str, Upstream], tmp_path: Path
) -> None:
    served = upstreams["partial"]
    project = _project(tmp_path, served, "old-mirror")
    # What earlier sparkbuild left: a bare repository, a redacted URL for humans, a full fetch.
    path = Mirror(project.cache, served.url).path
    git(tmp_path, "init", "-q", "--bare", str(path))
    git(path, "config", "remote.origin.url", served.url)
    git(path, "config", "gc.auto", "0")
    git(
        path, "fetch", "-q", "--tags", "--", served.url, "+refs/heads/main:refs/remotes/origin/main"
    )
    fresh = _project(tmp_path, served, "fresh")
    assert _settled(project) == _settled(fresh)
    assert not is_partial(path) and _missing(path) == 0
    assert _missing(_mirror(fresh)) > 0


def test_a_url_with_credentials_makes_a_full_mirror_and_is_never_stored(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path, "https://bot:s3cret-token@example.invalid/org/repo.git")
    with mirror.locked():
        pass
    config = (mirror.path / "config").read_text()
    assert "s3cret-token" not in config and "https://***@example.invalid" in config
    assert not mirror.partial


def test_bump_plans_the_same_on_a_partial_mirror(tmp_path: Path) -> None:
    def plan(filters: bool) -> dict[str, Any]:
        root = tmp_path / ("filtered" if filters else "plain")
        upstream = make_demo_upstream(root)
        if filters:
            git(upstream.bare, "config", "uploadpack.allowFilter", "true")
        project = make_demo_project(root, upstream, ["clash", "renamed", "absorbed"])
        result = run_cli(
            *("--project", str(project), "--cache-dir", str(root / "cache"), "--quiet"),
            *("--repo", f"sglang={upstream.url}", "bump", "sglang", "--to", "v1.1.0", "--json"),
        )
        payload: dict[str, Any] = json.loads(result.stdout)
        mirror = Mirror(root / "cache", upstream.url).path
        assert (_filter(mirror) == "blob:none") is filters
        if filters:
            assert _missing(mirror) > 0
        return {
            "items": [(i["id"], i["action"], i.get("strategy")) for i in payload["items"]],
            "variant": payload["files"].get("patches/sglang/renamed-1.1.0.patch"),
            "ready": payload["ready"],
        }

    planned = plan(filters=True)
    assert planned == plan(filters=False)
    assert ("patches/sglang/renamed.patch", "regenerated", "cherry-pick (renames followed)") in (
        planned["items"]
    )


def test_fetch_progress_reaches_the_spinner_as_short_meter_lines() -> None:
    seen: list[str] = []
    update = _shorten(seen.append)
    for line in (
        "remote: Enumerating objects: 120, done.",
        "Receiving objects:  42% (420/1000), 12.00 MiB | 3.00 MiB/s",
        "Resolving deltas: 100% (10/10), done.",
        " * [new tag]         v1.0.0     -> v1.0.0",
    ):
        update(line)
    assert seen == [
        "receiving objects 42% (420/1000), 12.00 MiB | 3.00 MiB/s",
        "resolving deltas 100% (10/10)",
    ]


def test_progress_streaming_passes_meter_lines_and_fails_as_git_does(
    upstreams: dict[str, Upstream], tmp_path: Path
) -> None:
    seen: list[str] = []
    repo = tmp_path / "r.git"
    git(tmp_path, "init", "-q", "--bare", str(repo))
    fetched = sb_git.run_with_progress(
        ["fetch", "--progress", "--", upstreams["partial"].url, "refs/heads/main:refs/heads/main"],
        git_dir=repo,
        on_progress=seen.append,
    )
    counting = [line for line in seen if re.match(r"remote: Counting objects: +\d+% \(", line)]
    assert len(counting) > 1, seen  # each carriage-return update as its own line, as it came
    assert b"Counting objects" in fetched.stderr
    written = sb_git.run_with_progress(
        ["hash-object", "-w", "--stdin"], git_dir=repo, input=b"x" * 200_000, on_progress=print
    )  # more input than a pipe holds, fed while git runs
    assert len(written.stdout.strip()) == 40
    with pytest.raises(sb_git.GitError, match=r"(?i)not a valid object name"):
        sb_git.run_with_progress(["cat-file", "-p", "nope"], git_dir=repo, on_progress=print)
