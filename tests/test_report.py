"""`sparkbuild report` and `report --diff` on a real lock (tests/support/report_project.py
says how each section is made): what the pages say, what a script reads, and the errors.

The pages themselves are loaded in a real browser in tests/test_report_browser.py; here they
are read as files.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sparkbuild import fileio, lockfile
from sparkbuild.publish.gate import _counted_verdict
from sparkbuild.report import view
from sparkbuild.report.dates import lock_dates, tree_dates
from sparkbuild.report.runs import BenchRuns
from sparkbuild.report.site import MANIFEST
from tests.support.gitrepos import Upstream, git, make_upstream
from tests.support.report_project import (
    DIGEST_2,
    HOSTILE_ENGINE,
    HOSTILE_LABEL,
    HOSTILE_TAG,
    IMAGE_1,
    IMAGE_2,
    PROFILE,
    SECRET,
    ReportProject,
    make_report_project,
)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return make_upstream(tmp_path_factory.mktemp("upstream"))


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> ReportProject:
    return make_report_project(tmp_path_factory.mktemp("report"), upstream)


@pytest.fixture
def project(made: ReportProject, tmp_path: Path) -> ReportProject:
    """A copy of the project (with its git history) that a test may change."""
    root = tmp_path / "project"
    shutil.copytree(made.root, root, symlinks=True)
    shutil.copytree(made.runs, tmp_path / "bench-runs")
    return ReportProject(root, made.cache, tmp_path / "bench-runs")


def report_json(project: ReportProject, *args: str) -> dict[str, Any]:
    result = project.run("report", *args, "--json")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_the_site_has_an_index_a_page_per_build_and_a_previous_published_page(
    made: ReportProject, tmp_path: Path
) -> None:
    out = tmp_path / "site"
    data = report_json(made, "--out", str(out), "--bench-runs", str(made.runs))
    pages = {(p["kind"], p["path"], p["build"]) for p in data["pages"]}
    assert pages == {
        ("index", "index.html", None),
        ("build", "builds/pkg-new.html", "pkg-new"),
        ("build", "builds/pkg-old.html", "pkg-old"),
        ("previous", "diff/pkg-new--previous.html", "pkg-new"),
    }
    assert data["pages"][0]["kind"] == "index"
    assert all((out / p["path"]).is_file() for p in data["pages"])
    (run,) = data["bench_runs"]["matched"]
    assert (run["build"], run["image_id"], run["recorded"], run["claims"]) == (
        "pkg-new", IMAGE_2, True, 1,
    )  # fmt: skip
    assert json.loads((out / MANIFEST).read_text())["pages"] == data["pages"]
    human = made.run("report", "--out", str(out))
    assert human.exit_code == 0, human.output
    assert f"open {out / 'index.html'}" in human.stdout
    assert f"report: 2 builds, 4 pages in {out}" in human.stdout


def test_every_stage_has_a_verdict_red_and_stale_ones_marked(made: ReportProject) -> None:
    lock = lockfile.load(made.lock_path)
    dates = lock_dates(made.lock_path, made.lock_path.read_text())
    context = view.Context(dates, datetime.now(UTC), 30, made.root)

    def row(name: str) -> dict[str, list[view.StageCell]]:
        return view.build_row(name, lock.builds[name], (PROFILE,), context).cells

    new, old = row("pkg-new"), row("pkg-old")
    (smoke_ref, smoke_url) = new["smoke"]
    assert (smoke_ref.verdict, smoke_ref.tone, smoke_ref.verified) == ("pass", "good", True)
    assert (smoke_url.label, smoke_url.tone, smoke_url.verified) == ("cpu-url", "warn", False)
    assert new["preflight"][0].verified is True and new["preflight"][0].tone == "good"
    assert new["publish"][0].tone == "good" and new["bench"][0].tone == "warn"  # a burst run
    assert all(c.date is not None and c.date.when is not None for c in new["smoke"])
    assert old["image"][0].tone == "stale"  # built from another tree than the locked source
    assert (old["preflight"][0].verdict, old["preflight"][0].tone) == ("missing", "bad")
    assert (old["smoke"][0].verdict, old["smoke"][0].tone) == ("missing", "bad")
    assert old["publish"][0].tone == "none"


def test_a_verdict_older_than_stale_days_is_stale(made: ReportProject, tmp_path: Path) -> None:
    report_json(made, "--out", str(tmp_path / "site"), "--stale-days", "0")
    index = (tmp_path / "site" / "index.html").read_text()
    cell = index[index.index('data-label="cpu-reference"') :][:600]
    assert 'data-tone="stale"' in cell and "stale after 0" in cell


def test_hostile_strings_are_text_and_secrets_are_masked(
    made: ReportProject, tmp_path: Path
) -> None:
    out = tmp_path / "site"
    report_json(made, "--out", str(out), "--bench-runs", str(made.runs))
    page = (out / "builds" / "pkg-new.html").read_text()
    for hostile in (HOSTILE_ENGINE, HOSTILE_LABEL, HOSTILE_TAG, "<em>stable</em>"):
        assert hostile not in page
    assert "0.32.0&lt;script&gt;document.title=&#34;pwned&#34;&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=" in page and "&lt;b&gt;bold&lt;/b&gt;" in page
    assert page.count("<script") == 0
    # The device-code table: each library's verdict, a hostile name as text.
    assert '<tr data-library="sglang-kernel"><td>sglang-kernel</td><td>0.4.2.post2</td>' in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "sm_100a sm_90a" in page
    for path in out.rglob("*.html"):
        assert SECRET not in path.read_text(), path
    assert "https://***@engine.example:8000" in page


def test_the_diff_names_the_changed_prs_wheels_and_digests(
    made: ReportProject, tmp_path: Path
) -> None:
    data = report_json(made, "--diff", "pkg-new@HEAD~1", "pkg-new", "--out", str(tmp_path))
    (page,) = data["pages"]
    assert page == {"kind": "diff", "path": "diff/pkg-new_HEAD_1--pkg-new.html",
                    "build": "pkg-new"}  # fmt: skip
    html = (tmp_path / page["path"]).read_text()
    rows = {
        item: html[html.index(f'data-item="{item}"') :].split("</tr>")[0]
        for item in ("#101", "#104", "demo-kernels")
    }
    assert "turned upstream" in rows["#101"]
    assert "added" in rows["#104"] and "applied" in rows["#104"]
    assert "bumped" in rows["demo-kernels"] and "1.0 (" in rows["demo-kernels"]
    image_id = html[html.index('data-field="image_id"') :].split("</tr>")[0]
    assert 'class="changed"' in image_id and IMAGE_1 in image_id and IMAGE_2 in image_id
    assert "Upstream commits" in html
    assert '"#103"' not in html  # unchanged: not listed


def test_published_sides_come_from_the_publish_history_and_git(
    made: ReportProject, tmp_path: Path
) -> None:
    data = report_json(made, "--diff", "pkg-new@published~1", "pkg-new@published",
                       "--out", str(tmp_path))  # fmt: skip
    html = (tmp_path / data["pages"][0]["path"]).read_text()
    assert "pkg-new from images.lock at " in html  # the revision that pinned image 1
    assert "turned upstream" in html and DIGEST_2[:20] in html


@pytest.mark.parametrize(
    ("sides", "message", "hint"),
    [
        (("pkg-new@no-such-rev", "pkg-new"), "no revision 'no-such-rev'", "git log --oneline"),
        (("pkg-new@--output=x", "pkg-new"), "is not a git revision", "git log --oneline"),
        (("nope@HEAD", "pkg-new"), "(builds there: pkg-new, pkg-old)",
         "name a build of that lock"),
        (("pkg-new@published~5", "pkg-new"), "pkg-new has 2 published images",
         "sparkbuild publish pkg-new"),
        (("pkg-old@published", "pkg-new"), "pkg-old has 0 published images", "BUILD@REV"),
        (("@HEAD", "pkg-new"), "names no build", "BUILD@published~N"),
    ],
)  # fmt: skip
def test_a_side_that_names_nothing_says_what_to_write(
    made: ReportProject, tmp_path: Path, sides: tuple[str, str], message: str, hint: str
) -> None:
    result = made.run("report", "--diff", *sides, "--out", str(tmp_path))
    assert result.exit_code == 2, result.output
    error, hint_line = result.stderr.strip().splitlines()[-2:]
    assert error.startswith("error: ") and message in error
    assert hint_line.startswith("hint: ") and hint in hint_line
    assert "Traceback" not in result.output


def test_a_lock_outside_git_has_no_dates_and_no_revisions(
    made: ReportProject, tmp_path: Path
) -> None:
    root = tmp_path / "plain"
    shutil.copytree(made.root, root, ignore=shutil.ignore_patterns(".git"))
    plain = ReportProject(root, made.cache, made.runs)
    data = report_json(plain, "--out", str(tmp_path / "site"))
    assert any("not committed in a git repository" in note for note in data["notes"])
    previous = (tmp_path / "site" / "diff" / "pkg-new--previous.html").read_text()
    assert "no revision of images.lock in git pins image" in previous  # the publish record only
    result = plain.run("report", "--diff", "pkg-new@HEAD", "pkg-new", "--out", str(tmp_path))
    assert result.exit_code == 2
    assert "is not in a git repository" in result.stderr and "git commit" in result.stderr
    same_lock = report_json(plain, "--diff", "pkg-old", "pkg-new", "--out", str(tmp_path))
    assert same_lock["pages"][0]["path"] == "diff/pkg-old--pkg-new.html"


def test_uncommitted_records_say_so(project: ReportProject, tmp_path: Path) -> None:
    lockfile.update_entry(project.lock_path, "pkg-old", lambda e: setattr(e, "requirements", []))
    lock = lockfile.load(project.lock_path)
    dates = lock_dates(project.lock_path, project.lock_path.read_text())
    assert dates.of("builds", "pkg-old", "requirements") is not None
    assert dates.of("builds", "pkg-old", "requirements").text == "uncommitted"  # type: ignore[union-attr]
    source = dates.of("builds", "pkg-old", "source")
    assert source is not None and source.when is not None
    assert lock.builds["pkg-old"].requirements == []


def test_each_line_is_dated_by_the_commit_git_blames_it_on(
    project: ReportProject, tmp_path: Path
) -> None:
    """The report blames the lock by runs of lines (`--incremental`) and reads each record's
    lines from the node tree it was loaded from: every line still gets the commit git's own
    line-by-line blame names (uncommitted ones too), and the records the same lines."""
    lockfile.update_entry(project.lock_path, "pkg-old", lambda e: setattr(e, "requirements", []))
    lock_path, text = project.lock_path, project.lock_path.read_text()
    _, tree = lockfile.load_with_tree(lock_path)
    dates = tree_dates(lock_path, tree)
    by_line = git(project.root, "blame", "--root", "-l", "-s", "--", lock_path.name).splitlines()
    assert [line.split()[0] for line in by_line] == [d.commit or "0" * 40 for d in dates.lines]
    assert len({d.commit for d in dates.lines}) >= 3  # several commits and the working copy
    assert dates == lock_dates(lock_path, text)


def test_the_report_replaces_only_a_report(project: ReportProject, tmp_path: Path) -> None:
    out = tmp_path / "site"
    report_json(project, "--out", str(out))
    (out / "stray.html").write_text("from an older report")
    report_json(project, "--out", str(out))
    assert not (out / "stray.html").exists() and (out / "index.html").is_file()

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    result = project.run("report", "--out", str(mine))
    assert result.exit_code == 2
    assert "not a sparkbuild report" in result.stderr and "hint: pass an empty" in result.stderr
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]

    before = (out / "index.html").read_text()
    failed = project.run("report", "--out", str(out), "--bench-runs", str(tmp_path / "none"))
    assert failed.exit_code == 2 and "--bench-runs" in failed.stderr
    assert (out / "index.html").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_cluster_runs_topology_and_nodes_are_shown(made: ReportProject) -> None:
    """A cluster run's topology and nodes: fields the record table does not name are listed
    under their own keys, so a record a newer stage writes is still shown whole."""
    record = lockfile.SmokeRecord(
        verdict="pass", verified=True, image_id=IMAGE_2, target="image:x",
        topology=lockfile.Topology(nodes=2, tp=2),
        nodes=[lockfile.NodeRecord(name="spark-<1>", rank=0, image_id=IMAGE_2)],
    )  # fmt: skip
    entry = lockfile.BuildEntry(
        image=lockfile.ImageSection(image_id=IMAGE_2), smoke={IMAGE_2: {PROFILE: record}}
    )
    context = view.Context(lock_dates(made.lock_path, ""), datetime.now(UTC), 30)
    row = view.build_row("x", entry, (), context)
    page = view.build_page("x", entry, row, BenchRuns(), context)
    extras = page.smoke[0].extras
    assert extras["topology"] == {"nodes": 2, "tp": 2}  # defaults are not written
    assert extras["nodes"][0]["name"] == "spark-<1>"
    from sparkbuild.report.render import environment

    html = environment().get_template("build.html").render(
        page=page, previous_page=None, root="../", has_index=True, lock_name="images.lock",
        generated="now", runs_read=0,
    )  # fmt: skip
    block = html[html.index('data-field="topology"') :].split("</div>")[0]
    assert "<dt>nodes</dt><dd>2" in block.replace("\n", "")
    nodes = html[html.index('data-field="nodes"') :].split("</div>")[0]
    assert "spark-&lt;1&gt;" in nodes  # escaped: a node's name is data


def test_a_publication_shows_its_signed_and_attested_state(made: ReportProject) -> None:
    signed = lockfile.SignedRecord(
        key="sha256:" + "5" * 64, signature="sha256:" + "6" * 64, referrers="tag",
        attestations={k: "sha256:" + "7" * 64 for k in ("sbom", "provenance", "verdicts")},
        sbom_packages=412,
    )  # fmt: skip

    def published(signed: lockfile.SignedRecord | None) -> lockfile.PublishRecord:
        return lockfile.PublishRecord(
            tag="t", digest="sha256:" + "8" * 64, image_id=IMAGE_2, verified=True, signed=signed
        )

    entry = lockfile.BuildEntry(
        image=lockfile.ImageSection(image_id=IMAGE_2),
        publish={"ghcr.io/a/signed": published(signed), "ghcr.io/a/plain": published(None)},
    )
    context = view.Context(lock_dates(made.lock_path, ""), datetime.now(UTC), 30)
    first, second = view.publish_cells("x", entry, context)
    assert first.notes[-1] == (
        "signed by sha256:555555555555; attested: provenance, sbom, verdicts; SBOM: 412 packages"
    )
    assert second.notes[-1] == "not signed"


def test_no_builds_is_an_error_naming_the_next_command(tmp_path: Path, run_cli: Any) -> None:
    (tmp_path / "images.lock").write_text("schema: 1\nbuilds: {}\n")
    result = run_cli("--project", str(tmp_path), "report", "--out", str(tmp_path / "site"))
    assert result.exit_code == 2
    assert "has no builds" in result.stderr and "sparkbuild lock" in result.stderr


def test_git_history_is_read_not_written(made: ReportProject, tmp_path: Path) -> None:
    head = git(made.root, "rev-parse", "HEAD")
    status = git(made.root, "status", "--porcelain")
    report_json(made, "--diff", "pkg-new@HEAD~1", "pkg-new", "--out", str(tmp_path))
    assert (git(made.root, "rev-parse", "HEAD"), git(made.root, "status", "--porcelain")) == (
        head, status,
    )  # fmt: skip


def test_an_entry_read_from_git_alone_is_the_entry_the_whole_lock_holds(
    made: ReportProject,
) -> None:
    """History is read one entry at a time where the lock is laid out as sparkbuild writes
    it: that entry must be the whole lock's, and a look-alike outside `builds:` or a layout
    sparkbuild never writes must not be taken for it."""
    from sparkbuild.report.sides import parse_entry, parse_lock

    text = made.lock_path.read_text(encoding="utf-8")
    whole = parse_lock(text, "images.lock")
    for build in whole.builds:
        entry, names = parse_entry(text, build, "images.lock")
        assert entry == whole.entry(build)
        assert sorted(names) == sorted(whole.builds)
    build = next(iter(whole.builds))
    decoy = f"aaa:\n  {build}:\n    image: null\n"  # sorts before `builds:`, as dumps sorts
    assert parse_entry(decoy + text, build, "images.lock")[0] == whole.entry(build)
    gapped = text.replace(f"  {build}:\n", f"  {build}:\n\n", 1)  # blank line: read it whole
    assert parse_entry(gapped, build, "images.lock")[0] == whole.entry(build)


def _report_files(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): p.read_text() for p in sorted(out.rglob("*")) if p.is_file()}


def test_an_interrupted_report_leaves_the_previous_one_or_the_new_one(
    project: ReportProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34, high: a report stopped between its two renames left no report at --out.
    Ctrl-C (a real SIGINT) lands before each step in turn, every file written, renamed or
    removed: --out holds a whole report every time, the previous one or the new one, and
    no scratch is left beside it."""
    out = tmp_path / "site"
    report_json(project, "--out", str(out))
    (out / "from-before.html").write_text("the previous report")  # tells the two apart
    previous = _report_files(out)
    steps = [(Path, "rename"), (Path, "write_text"), (Path, "mkdir"), (os, "replace"),
             (os, "rename"), (shutil, "rmtree"), (fileio, "_exchange")]  # fmt: skip
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupted = 0
        for step in itertools.count(1):
            stop = _StopAt(step)
            with monkeypatch.context() as patch:
                for owner, name in steps:
                    if hasattr(owner, name):
                        patch.setattr(owner, name, stop.before(getattr(owner, name)))
                result = project.run("report", "--out", str(out))
            files = _report_files(out)
            assert "index.html" in files and MANIFEST in files, (step, sorted(files))
            if "from-before.html" in files:
                assert files == previous, step
            pages = json.loads(files[MANIFEST])["pages"]
            assert {p["path"] for p in pages} <= set(files), step
            assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], step
            if stop.calls < step:
                break
            assert result.exit_code == 130 and "interrupted" in result.stderr, result.output
            interrupted += 1
    finally:
        signal.signal(signal.SIGINT, handler)
    assert interrupted > 10 and "from-before.html" not in _report_files(out)


class _StopAt:
    """Sends this process SIGINT just before the ``step``-th call of what it wraps."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.calls = 0

    def before(self, original: Any) -> Any:
        def stop_here(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.step:
                os.kill(os.getpid(), signal.SIGINT)
            return original(*args, **kwargs)

        return stop_here


def test_a_url_verdict_marked_verified_is_counted_and_shown_as_a_url_verdict(
    project: ReportProject, tmp_path: Path
) -> None:
    """Issue 34, high: a smoke record of a --url target marked verified (a hand-edited lock,
    or a forged one) was shown and counted as an image-verified pass. Only a run of the
    image itself is; the others are labelled by what ran."""
    lock = lockfile.load(project.lock_path)
    entry = lock.builds["pkg-new"]
    image_id = view.current_image(entry)
    assert image_id is not None and entry.smoke is not None
    by_url = entry.smoke[image_id]["cpu-url"]
    forged = by_url.model_copy(update={"verified": True, "image_id": image_id})
    entry.smoke[image_id]["cpu-url"] = forged
    context = view.Context(lock_dates(project.lock_path, ""), datetime.now(UTC), 30, None)
    cells = view.build_row("pkg-new", entry, (PROFILE,), context).cells["smoke"]
    url_cell = next(c for c in cells if c.label == "cpu-url")
    assert (url_cell.tone, url_cell.verified) == ("warn", False)
    assert url_cell.notes[0].startswith("unverified: a url run (url:")
    assert view.obtained(forged, image_id).startswith("a url run (")
    assert _counted_verdict(forged, image_id).startswith("unverified pass (url:")
    # As the report shows it: the page and the index call it unverified.
    project.lock_path.write_text(lockfile.dumps(lock))
    out = tmp_path / "site"
    report_json(project, "--out", str(out))
    index = (out / "index.html").read_text()
    cell = index[index.index('data-label="cpu-url"') :][:800]
    assert "tag-unverified" in cell and "tag-verified" not in cell


def test_the_build_page_says_whether_the_image_is_reproducible(
    project: ReportProject, tmp_path: Path
) -> None:
    def page(build: str) -> str:
        out = tmp_path / f"site-{build}"
        report_json(project, "--out", str(out), "--bench-runs", str(project.runs))
        return (out / "builds" / f"{build}.html").read_text()

    assert "not checked" in page("pkg-new")

    def mark(entry: lockfile.BuildEntry) -> None:
        assert entry.image is not None
        entry.image.reproducible = False
        entry.image.differences = ["/etc/build-time: content 1a vs 2b, layer 5 (RUN date)"]
        entry.image.builder = {"engine": "Docker Engine 20.10.24", "canonical_form": "1"}

    lockfile.update_entry(project.lock_path, "pkg-new", mark)
    html = page("pkg-new")
    assert "<strong>no</strong>" in html
    assert "/etc/build-time: content 1a vs 2b" in html
    assert "Docker Engine 20.10.24" in html


def test_a_link_at_out_is_replaced_and_what_it_points_to_is_left(
    made: ReportProject, tmp_path: Path
) -> None:
    """A symlink planted at the report's directory (issue 46, What 3): the report replaces
    the link, and the directory it pointed to keeps exactly what it had."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "site").symlink_to(elsewhere)
    report_json(made, "--out", str(tmp_path / "site"))
    assert not (tmp_path / "site").is_symlink() and (tmp_path / "site" / "index.html").is_file()
    assert list(elsewhere.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "site"]


def test_a_diff_is_never_written_through_a_planted_link(
    made: ReportProject, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    out = tmp_path / "site"
    out.mkdir()
    (out / "diff").symlink_to(elsewhere)  # dangling: nothing may be made there
    result = made.run("report", "--diff", "pkg-new@HEAD~1", "pkg-new", "--out", str(out))
    assert result.exit_code != 0 and "is a symlink" in result.stderr, result.output
    assert not elsewhere.exists() and "Traceback" not in result.output
    assert sorted(p.name for p in out.iterdir()) == ["diff"]  # no scratch left
