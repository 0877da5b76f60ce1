"""The source stage end to end on real git repositories (no network)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.gitrepos import Upstream, git, make_patch, make_upstream
from tests.support.source_project import SourceProject


class Project(SourceProject):
    def json(self, *args: str) -> dict[str, Any]:
        result = self.run(*args, "--json")
        data: dict[str, Any] = json.loads(result.stdout)
        data["_exit"] = result.exit_code
        return data


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
      - {file: patches/pkg/applies.patch}
      - {file: patches/pkg/version-upstream.patch}
      - {file: patches/pkg/old-only.patch, when: "<1.0"}
      - {file: patches/pkg/delta-1.patch}
    builds:
      old:
        ref: v1.0.0
      new:
        ref: v1.1.0
      head:
        ref: main
        version: "1.2.0.dev0"
        prs: [{number: 105}, {number: 999}]
        patches: [{file: patches/pkg/not-there.patch}]
"""


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return make_upstream(tmp_path_factory.mktemp("upstream"))


@pytest.fixture
def project(tmp_path: Path, upstream: Upstream) -> Project:
    proj = Project.create(tmp_path, upstream)
    patches = proj.patches
    alpha = "python/pkg/alpha.py"
    init = "python/pkg/__init__.py"
    delta = "python/pkg/delta.py"
    header = "What: a local fix.\nWhy: the tests need one.\n"
    (patches / "applies.patch").write_text(
        make_patch(
            upstream.work,
            "v1.0.0",
            {alpha: ("alpha line 20\n", "alpha line 20 (ours)\n")},
            header=header,
        )
    )
    (patches / "version-upstream.patch").write_text(
        make_patch(upstream.work, "v1.0.0", {init: ("1.0.0", "1.1.0")}, header=header)
    )
    (patches / "old-only.patch").write_text(
        make_patch(
            upstream.work,
            "v1.0.0",
            {alpha: ("alpha line 1\n", "alpha line 1 (0.x)\n")},
            header=header,
        )
    )
    (patches / "delta-1.patch").write_text(
        make_patch(
            upstream.work,
            "v1.0.0",
            {delta: ("delta line 1\n", "delta line 1 (ours)\n")},
            header=header,
        )
    )
    proj.write_spec(SPEC)
    return proj


def statuses(report: dict[str, Any], build: str) -> dict[str, str]:
    (entry,) = [b for b in report["builds"] if b["build"] == build]
    return {item["id"]: item["status"] for item in entry["items"]}


def items(report: dict[str, Any], build: str) -> dict[str, dict[str, Any]]:
    (entry,) = [b for b in report["builds"] if b["build"] == build]
    return {item["id"]: item for item in entry["items"]}


def test_every_status_on_real_repositories(project: Project) -> None:
    report = project.json("patches")
    assert report["_exit"] == 1  # 'head' has conflicts and missing items
    assert statuses(report, "old") == {
        "#101": "applied",  # merged by merge commit after v1.0.0
        "#102": "applied",  # squash-merged after v1.0.0
        "#103": "applied",  # open PR forked from a later main
        "#104": "out-of-range",
        "#106": "applied",
        "patches/pkg/applies.patch": "applied",
        "patches/pkg/version-upstream.patch": "applied",
        "patches/pkg/old-only.patch": "out-of-range",
        "patches/pkg/delta-1.patch": "applied",
    }
    assert statuses(report, "new") == {
        "#101": "upstream",  # its head is in v1.1.0
        "#102": "upstream",  # squashed: found by reverse apply
        "#103": "applied",
        "#104": "applied",
        "#106": "upstream",  # squash-merged; later commits changed the same line
        "patches/pkg/applies.patch": "applied",
        "patches/pkg/version-upstream.patch": "upstream",  # v1.1.0 made the same change
        "patches/pkg/old-only.patch": "out-of-range",
        "patches/pkg/delta-1.patch": "conflict",  # main rewrote delta line 1 before v1.1.0
    }
    head = statuses(report, "head")
    assert head["#105"] == "conflict"
    assert head["#999"] == "missing"
    assert head["patches/pkg/not-there.patch"] == "missing"


def test_merge_commit_pr_is_detected_as_merged(project: Project) -> None:
    pr101 = items(project.json("patches", "new"), "new")["#101"]
    assert "merged" in pr101["detail"]
    assert pr101["head"] == project.upstream.prs[101]


def test_squash_merge_found_by_its_title_after_later_edits(project: Project) -> None:
    pr106 = items(project.json("patches", "new"), "new")["#106"]
    assert pr106["detail"].startswith("squash-merged upstream as ")
    assert "Tidy delta (#106)" in pr106["detail"]


def test_conflict_names_files_and_hunks(project: Project) -> None:
    item = items(project.json("patches", "new"), "new")["patches/pkg/delta-1.patch"]
    assert item["files"] == ["python/pkg/delta.py"]
    assert "python/pkg/delta.py @@ -1,4 +1,4 @@" in item["detail"]


def test_pr_brings_only_its_own_commits(project: Project, tmp_path: Path) -> None:
    out = tmp_path / "tree"
    result = project.run("prepare", "old", "--out", str(out))
    assert result.exit_code == 0, result.output
    # PR #103 was forked after main changed delta line 15; that change must not come along.
    assert "delta line 15\n" in (out / "python/pkg/delta.py").read_text()
    assert "gamma line 3 (fixed by #103)" in (out / "python/pkg/gamma.py").read_text()
    pr103 = items(project.json("patches", "old"), "old")["#103"]
    assert pr103["commits"] == [project.upstream.prs[103]]
    pr101 = items(project.json("patches", "old"), "old")["#101"]
    assert len(pr101["commits"]) == 2  # both commits of the merged branch, not the merge


def test_prepare_prints_the_tree_hash_of_the_checkout(project: Project, tmp_path: Path) -> None:
    out = tmp_path / "tree"
    result = project.run("prepare", "old", "--out", str(out))
    assert result.exit_code == 0, result.output
    tree = result.stdout.strip()
    git(out, "add", "-A")
    assert git(out, "write-tree") == tree
    log = git(out, "log", "--format=%s")
    assert "sparkbuild: PR #101" in log and "sparkbuild: patch patches/pkg/delta-1.patch" in log
    # Running again into the same directory reuses it and gives the same tree.
    again = project.run("prepare", "old", "--out", str(out))
    assert again.stdout.strip() == tree


def test_prepare_on_conflict_leaves_the_tree_and_the_next_command(
    project: Project, tmp_path: Path
) -> None:
    out = tmp_path / "tree"
    result = project.run("prepare", "new", "--out", str(out))
    assert result.exit_code == 1
    assert f"cd {out} && git apply --3way .git/sparkbuild/delta-1.patch" in result.stderr
    saved = out / ".git" / "sparkbuild" / "delta-1.patch"
    assert saved.read_bytes() == (project.root / "patches/pkg/delta-1.patch").read_bytes()
    # The checkout stops before the conflicting patch: earlier items are in, it is not.
    assert "alpha line 20 (ours)" in (out / "python/pkg/alpha.py").read_text()
    assert "delta line 1 (main)" in (out / "python/pkg/delta.py").read_text()
    three_way = subprocess.run(
        ["git", "apply", "--3way", str(saved)], cwd=out, capture_output=True, text=True, check=False
    )
    assert three_way.returncode != 0 and "conflict" in three_way.stderr.lower()


def test_a_second_conflict_names_the_tree_before_it(project: Project, tmp_path: Path) -> None:
    out = tmp_path / "tree"
    result = project.run("prepare", "head", "--out", str(out))
    assert result.exit_code == 1
    # The checkout stops before the first conflict (#105); applies.patch comes after it.
    assert "(ours)" not in (out / "python/pkg/alpha.py").read_text()
    assert f"#105 does not apply. The tree before it is at {out};" in result.stderr
    branch = "sparkbuild-before/delta-1"
    shown = f"cd {out} && git checkout --quiet {branch} && git apply --3way .git/sparkbuild/"
    assert shown + "delta-1.patch" in result.stderr
    assert "alpha line 20 (ours)" in git(out, "show", f"{branch}:python/pkg/alpha.py")
    assert "sparkbuild prepare" not in result.stderr  # the hint names no command just run
    git(out, "checkout", "--quiet", branch)
    three_way = subprocess.run(
        ["git", "apply", "--3way", ".git/sparkbuild/delta-1.patch"],
        cwd=out, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert three_way.returncode != 0 and "python/pkg/delta.py" in three_way.stderr


def test_prepare_refuses_a_foreign_directory(project: Project, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    result = project.run("prepare", "old", "--out", str(out))
    assert result.exit_code == 1
    assert "is not a sparkbuild checkout" in result.stderr
    assert (out / "notes.txt").read_text() == "keep me"


def test_lock_round_trips_and_is_canonical(project: Project) -> None:
    assert project.run("lock", "old", "new").exit_code == 1  # 'new' has a conflict
    lock = project.lock
    assert set(lock["builds"]) == {"old"}  # a failed build is never written
    source = lock["builds"]["old"]["source"]
    assert source["commit"] == project.upstream.tags["v1.0.0"]
    assert source["repo"] == project.upstream.url
    assert [p["number"] for p in source["prs"]] == [101, 102, 103, 104, 106]
    assert source["prs"][0]["head"] == project.upstream.prs[101]
    assert all(len(p["sha256"]) == 64 for p in source["patches"])
    text = (project.root / "images.lock").read_text()
    # Canonical: writing the same resolution again changes no byte.
    assert project.run("lock", "old").exit_code == 0
    assert (project.root / "images.lock").read_text() == text
    assert project.run("lock", "old", "--check").exit_code == 0
    locked = project.json("prepare", "old", "--locked", "--out", str(project.root / "t"))
    assert locked["builds"][0]["tree"] == source["tree"]


def test_lock_check_reports_an_edited_patch_offline(project: Project) -> None:
    assert project.run("lock", "old").exit_code == 0
    patch = project.root / "patches/pkg/applies.patch"
    patch.write_text(patch.read_text().replace("(ours)", "(ours, v2)"))
    # Offline: the upstream repository is not consulted.
    project.write_spec(SPEC, repo="/nonexistent/upstream.git")
    result = project.run("lock", "old", "--check")
    assert result.exit_code == 1
    assert "patch patches/pkg/applies.patch changed" in result.stderr
    assert "sparkbuild lock" in result.stderr


def test_locked_refuses_stale_lock_and_keeps_it(project: Project) -> None:
    assert project.run("lock", "old").exit_code == 0
    before = (project.root / "images.lock").read_text()
    patch = project.root / "patches/pkg/applies.patch"
    patch.write_text(patch.read_text().replace("(ours)", "(ours, v2)"))
    result = project.run("patches", "old", "--locked")
    assert result.exit_code == 1
    assert "--locked, but the lock does not match" in result.stderr
    assert (project.root / "images.lock").read_text() == before


def test_locked_detects_a_moved_pr_head(project: Project) -> None:
    assert project.run("lock", "old").exit_code == 0
    up = project.upstream
    original = up.prs[103]
    try:
        git(up.work, "checkout", "-q", "pr103")
        (up.work / "python/pkg/gamma.py").write_text(
            (up.work / "python/pkg/gamma.py").read_text().replace("gamma line 4\n", "g4 (new)\n")
        )
        git(up.work, "commit", "-q", "-am", "pr103: more")
        up.set_pr(103, git(up.work, "rev-parse", "HEAD"))
        result = project.run("prepare", "old", "--locked")
        assert result.exit_code == 1
        assert "PR #103 head moved since it was locked" in result.stderr
        assert f"locked {original[:12]}" in result.stderr
    finally:
        up.set_pr(103, original)
        git(up.work, "checkout", "-q", "main")


def test_locked_uses_the_pinned_commit_not_the_moving_branch(project: Project) -> None:
    project.write_spec("""\
        engine: sglang
        repo: REPO
        package_dir: python/pkg
        prs: [{number: 103}]
        builds:
          old: {ref: main, version: "1.2.0"}
    """)
    assert project.run("lock", "old").exit_code == 0
    pinned = project.lock["builds"]["old"]["source"]["commit"]
    up = project.upstream
    git(up.work, "checkout", "-q", "main")
    (up.work / "README").write_text("moved\n")
    git(up.work, "add", "README")
    git(up.work, "commit", "-q", "-m", "main moves on")
    up.push_main()
    try:
        report = project.json("patches", "old", "--locked")
        assert report["builds"][0]["base_commit"] == pinned
        fresh = project.json("patches", "old")
        assert fresh["builds"][0]["base_commit"] != pinned
    finally:
        git(up.work, "reset", "-q", "--hard", "HEAD~1")
        up.push_main()


def test_repo_override_is_for_one_run(project: Project, upstream: Upstream) -> None:
    project.write_spec(SPEC, repo="https://github.invalid/x.git")
    result = project.run("--repo", f"sglang={upstream.url}", "lock", "old")
    assert result.exit_code == 0, result.output
    # The lock records the spec's URL; the override only said where to fetch from.
    assert project.lock["builds"]["old"]["source"]["repo"] == "https://github.invalid/x.git"


def test_unreachable_remote_names_the_url(project: Project) -> None:
    project.write_spec(SPEC, repo="/nonexistent/upstream.git")
    result = project.run("patches", "old")
    assert result.exit_code == 1
    assert "/nonexistent/upstream.git" in result.stderr
    assert "tried 2 times" in result.stderr
    assert "Traceback" not in result.output


def test_unknown_build_lists_the_known_ones(project: Project) -> None:
    result = project.run("patches", "nope")
    assert result.exit_code == 2
    assert "unknown build 'nope'; known builds: head, new, old" in result.stderr


def test_concurrent_runs_share_one_cache(project: Project) -> None:
    command = [
        sys.executable,
        "-m",
        "sparkbuild.cli",
        "--project",
        str(project.root),
        "--cache-dir",
        str(project.cache),
        "--quiet",
        "patches",
        "old",
        "new",
        "--json",
    ]
    runs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(4)
    ]
    outputs = [run.communicate(timeout=300) for run in runs]
    trees = set()
    for (stdout, stderr), run in zip(outputs, runs, strict=True):
        assert run.returncode == 1, stderr.decode()  # 'new' has its conflict in every run
        report = json.loads(stdout)
        trees.add(tuple(b["tree"] for b in report["builds"]))
    assert len(trees) == 1
    git(
        project.cache
        / "mirrors"
        / next(p.name for p in (project.cache / "mirrors").iterdir() if p.suffix == ".git"),
        "fsck",
        "--no-progress",
    )


def _tamper(project: Project, **source: Any) -> None:
    path = project.root / "images.lock"
    data = yaml.safe_load(path.read_text())
    data["builds"]["old"]["source"].update(source)
    path.write_text(yaml.safe_dump(data))


def test_a_lock_pinning_another_tags_commit_fails_check_and_locked(project: Project) -> None:
    assert project.run("lock", "old").exit_code == 0
    # The spec says v1.0.0; the lock is edited to pin v1.1.0's commit.
    _tamper(project, commit=project.upstream.tags["v1.1.0"])
    wanted = f"pins commit {project.upstream.tags['v1.1.0'][:12]}, but tag v1.0.0 is"
    for command in (["lock", "old", "--check"], ["prepare", "old", "--locked"]):
        result = project.run(*command)
        assert result.exit_code == 1, (command, result.output)
        assert wanted in result.stderr and "builds.old.source.commit" in result.stderr
    assert project.run("patches", "old", "--locked").exit_code == 1


def test_a_lock_with_a_tree_of_zeros_fails_check_and_locked(project: Project) -> None:
    assert project.run("lock", "old").exit_code == 0
    real_tree = project.lock["builds"]["old"]["source"]["tree"]
    _tamper(project, tree="0" * 40)
    for command in (["lock", "old", "--check"], ["prepare", "old", "--locked"]):
        result = project.run(*command)
        assert result.exit_code == 1, (command, result.output)
        assert f"the patched tree is {real_tree[:12]}" in result.stderr
        assert "pins 000000000000 (`builds.old.source.tree`)" in result.stderr


@pytest.mark.docker
def test_build_locked_refuses_a_tampered_tree(project: Project) -> None:
    assert project.run("lock", "old").exit_code == 0
    path = project.root / "images.lock"
    data = yaml.safe_load(path.read_text())
    data["builds"]["old"]["source"]["tree"] = "0" * 40
    # An image entry as `build` writes it, so --locked gets as far as the source.
    data["builds"]["old"]["image"] = {"inputs_digest": "sha256:" + "1" * 64}
    path.write_text(yaml.safe_dump(data))
    result = project.run("build", "old", "--locked")
    assert result.exit_code == 1, result.output
    assert "pins 000000000000 (`builds.old.source.tree`)" in result.stderr


def test_lock_check_validates_the_schema(project: Project) -> None:
    assert project.run("lock", "old").exit_code == 0
    path = project.root / "images.lock"
    good = yaml.safe_load(path.read_text())
    cases = {
        "no `schema:` field": {k: v for k, v in good.items() if k != "schema"},
        "`schema: 2` is not 1": {**good, "schema": 2},
        "builds.old.source.commit": {
            **good,
            "builds": {"old": {"source": {**good["builds"]["old"]["source"], "commit": "v1.1"}}},
        },
    }
    for message, data in cases.items():
        path.write_text(yaml.safe_dump(data))
        result = project.run("lock", "old", "--check")
        assert result.exit_code == 1, (message, result.output)
        assert message in result.stderr and "not a valid sparkbuild lock" in result.stderr


def test_lock_check_without_a_lock_file_is_its_own_state(project: Project) -> None:
    assert not (project.root / "images.lock").exists()
    result = project.run("lock", "--check")
    assert result.exit_code == 0, result.output
    assert "no images.lock yet" in result.stderr and "sparkbuild lock" in result.stderr
    assert not (project.root / "images.lock").exists()


def test_prepare_never_writes_a_checkout_through_a_link(project: Project, tmp_path: Path) -> None:
    """A link at --out (a planted one, or the cache's trees/BUILD) is refused, not followed
    into the directory it points to (issue 46, What 3)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "tree").symlink_to(elsewhere)
    result = project.run("prepare", "old", "--out", str(tmp_path / "tree"))
    assert result.exit_code == 1, result.output
    assert "is a symlink" in result.stderr and "Traceback" not in result.output
    assert list(elsewhere.iterdir()) == []
