"""Real upstream-like git repositories for the tests: tags, a moving main, and PR refs.

History of the repository :func:`make_upstream` builds (``main``)::

    v1.0.0 ── merge PR #101 ── squash PR #102 ── unrelated ── v1.1.0 ── unrelated ── main
                                                                  └── PR #103 (open), PR #104 (open)

- PR #101: merged by a merge commit; PR #102: merged by squash (a new commit);
- PR #103: open, forked after v1.1.0; on v1.0.0 only its own commit may be applied;
- PR #104: open, edits a line as v1.1.0 left it: applies on v1.1.0, conflicts on v1.0.0;
- PR #105: open, edits a line that main changed again later: conflicts everywhere;
- PR #106: squash-merged as "Tidy delta (#106)" before v1.1.0, and the same lines changed
  again after: neither its head nor a reverse apply finds it, GitHub's title does.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

IDENTITY = {
    "GIT_AUTHOR_NAME": "Upstream Dev",
    "GIT_AUTHOR_EMAIL": "dev@example.invalid",
    "GIT_COMMITTER_NAME": "Upstream Dev",
    "GIT_COMMITTER_EMAIL": "dev@example.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}

# What a patch test asks of a file: (old, new) replaces the first `old`; a string is the
# whole new text; None deletes the file.
Edit = tuple[str, str] | str | None


def git_env(**extra: str) -> dict[str, str]:
    """The environment every test git runs in: this process's, minus any GIT_* it inherited
    (a hook's GIT_DIR or GIT_INDEX_FILE), with a fixed identity and no user or system config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env |= IDENTITY | {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "TZ": "UTC"}
    return env | extra


def git(
    cwd: Path, *args: str, input: str | None = None, env: Mapping[str, str] | None = None
) -> str:
    """``git ARGS`` in ``cwd`` (a work tree or a bare repository); its stdout, stripped.
    A failure is an AssertionError that shows git's own output."""
    result = subprocess.run(
        ["git", *args],
        cwd=cwd,
        env=git_env(**(env or {})),
        input=input,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(
            f"git {' '.join(args)} failed in {cwd}:\n{result.stdout}{result.stderr}"
        )
    return result.stdout.strip()


def tagged_repo(work: Path, tag: str, message: str) -> str:
    """Make the files in ``work`` a repository on ``main`` with one commit, tagged ``tag``."""
    git(work, "init", "--quiet", "--initial-branch=main")
    git(work, "add", "--all", ".")
    git(work, "commit", "--quiet", "-m", message)
    git(work, "tag", tag)
    return git(work, "rev-parse", "HEAD")


def lines(name: str, count: int = 30) -> str:
    return "".join(f"{name} line {i}\n" for i in range(1, count + 1))


def replace_line(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def commit_all(work: Path, message: str) -> str:
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", message)
    return git(work, "rev-parse", "HEAD")


@dataclass
class Upstream:
    bare: Path
    work: Path
    tags: dict[str, str] = field(default_factory=dict)
    prs: dict[int, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return str(self.bare)

    def set_pr(self, number: int, commit: str) -> None:
        git(self.work, "push", "-q", "--force", str(self.bare), f"{commit}:refs/pull/{number}/head")
        self.prs[number] = commit

    def push_main(self) -> None:
        git(self.work, "push", "-q", "--force", str(self.bare), "main", "--tags")


def _first_release(
    root: Path, version: str, modules: tuple[str, ...], extra: Mapping[str, str] | None = None
) -> tuple[Upstream, Path]:
    """A work tree on ``main`` whose first commit is tagged ``v<version>``: python/pkg with
    ``modules`` of numbered lines, and ``extra`` files. Returns the upstream (not pushed
    yet) and python/pkg."""
    work = root / "work"
    work.mkdir(parents=True)
    git(work, "init", "-q", "-b", "main")
    pkg = work / "python" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = '{version}'\n")
    for name in modules:
        (pkg / f"{name}.py").write_text(lines(name))
    for path, text in (extra or {}).items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(text)
    commit_all(work, "initial")
    git(work, "tag", f"v{version}")
    up = Upstream(bare=root / "upstream.git", work=work)
    up.tags[f"v{version}"] = git(work, "rev-parse", "HEAD")
    return up, pkg


def make_upstream(root: Path) -> Upstream:
    kernel = {"csrc/kernel.cu": lines("kernel", 10)}
    up, pkg = _first_release(root, "1.0.0", ("alpha", "beta", "gamma", "delta"), kernel)
    work, bare = up.work, up.bare

    # PR #101: two commits on a branch, merged with a merge commit.
    git(work, "checkout", "-q", "-b", "pr101")
    replace_line(pkg / "alpha.py", "alpha line 5\n", "alpha line 5 (fixed by #101)\n")
    commit_all(work, "pr101: fix alpha 5")
    replace_line(pkg / "alpha.py", "alpha line 6\n", "alpha line 6 (fixed by #101)\n")
    pr101 = commit_all(work, "pr101: fix alpha 6")
    git(work, "checkout", "-q", "main")
    replace_line(pkg / "delta.py", "delta line 1\n", "delta line 1 (main)\n")
    commit_all(work, "main: unrelated delta change")
    git(work, "merge", "-q", "--no-ff", "-m", "Merge PR #101", "pr101")

    # PR #102: a branch whose change lands on main as one squashed commit.
    git(work, "checkout", "-q", "-b", "pr102")
    replace_line(pkg / "beta.py", "beta line 10\n", "beta line 10 (fixed by #102)\n")
    commit_all(work, "pr102: part 1")
    (pkg / "epsilon.py").write_text(lines("epsilon", 5))
    pr102 = commit_all(work, "pr102: part 2")
    git(work, "checkout", "-q", "main")
    git(work, "merge", "-q", "--squash", "pr102")
    commit_all(work, "Squashed PR #102")

    git(work, "checkout", "-q", "-b", "pr106")
    replace_line(pkg / "delta.py", "delta line 25\n", "delta line 25 (#106)\n")
    pr106 = commit_all(work, "pr106: tidy delta")
    git(work, "checkout", "-q", "main")
    git(work, "merge", "-q", "--squash", "pr106")
    commit_all(work, "Tidy delta (#106)")
    replace_line(pkg / "delta.py", "delta line 25 (#106)\n", "delta line 25 (later)\n")
    commit_all(work, "main: rework delta 25")

    replace_line(pkg / "gamma.py", "gamma line 20\n", "gamma line 20 (v1.1.0)\n")
    replace_line(pkg / "__init__.py", "1.0.0", "1.1.0")
    commit_all(work, "release 1.1.0")
    git(work, "tag", "v1.1.0")
    up.tags["v1.1.0"] = git(work, "rev-parse", "HEAD")

    # Unrelated work on main after the tag; PRs forked later must not drag it in.
    replace_line(pkg / "delta.py", "delta line 15\n", "delta line 15 (main, after 1.1.0)\n")
    commit_all(work, "main: after v1.1.0")

    git(work, "checkout", "-q", "-b", "pr103")
    replace_line(pkg / "gamma.py", "gamma line 3\n", "gamma line 3 (fixed by #103)\n")
    pr103 = commit_all(work, "pr103: fix gamma 3")

    git(work, "checkout", "-q", "main")
    git(work, "checkout", "-q", "-b", "pr104")
    replace_line(pkg / "gamma.py", "gamma line 20 (v1.1.0)\n", "gamma line 20 (#104)\n")
    pr104 = commit_all(work, "pr104: rewrite gamma 20")

    git(work, "checkout", "-q", "main")
    git(work, "checkout", "-q", "-b", "pr105")
    replace_line(pkg / "delta.py", "delta line 15 (main, after 1.1.0)\n", "delta line 15 (#105)\n")
    pr105 = commit_all(work, "pr105: delta 15")
    git(work, "checkout", "-q", "main")
    replace_line(pkg / "delta.py", "delta line 15 (main, after 1.1.0)\n", "delta line 15 (main2)\n")
    commit_all(work, "main: delta 15 again")

    git(root, "init", "-q", "--bare", str(bare))
    up.push_main()
    prs = {101: pr101, 102: pr102, 103: pr103, 104: pr104, 105: pr105, 106: pr106}
    for number, commit in prs.items():
        up.set_pr(number, commit)
    return up


def make_patch(repo: Path | str, ref: str, edits: Mapping[str, Edit], *, header: str = "") -> str:
    """A git-style patch of ``edits`` on top of ``ref`` of ``repo`` (a work tree, a bare
    repository or its URL), after ``header`` (what it fixes, its ``when:``) if given."""
    with tempfile.TemporaryDirectory(prefix="sparkbuild-patch-") as tmp:
        work = Path(tmp) / "work"
        git(Path(tmp), "clone", "--quiet", "--no-checkout", str(repo), str(work))
        git(work, "-c", "advice.detachedHead=false", "checkout", "--quiet", ref)
        for path, edit in edits.items():
            _edit(work / path, edit)
        git(work, "add", "--all", ".")
        diff = git(work, "diff", "--cached", "--binary")
    return (header.rstrip("\n") + "\n\n" if header else "") + diff + "\n"


def _edit(target: Path, edit: Edit) -> None:
    if edit is None:
        target.unlink()
    elif isinstance(edit, tuple):
        replace_line(target, *edit)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(edit)


def make_linear_upstream(root: Path) -> Upstream:
    """An upstream whose PRs land without a merge commit of their own::

        v0.1.0 ── PR #201 (fast-forwarded) ── v0.2.0 ── unrelated ── #202 rebased ── v0.3.0
                                                 └── PR #202 (two commits, its own SHAs)

    - PR #201's head is itself a commit of ``main``'s first-parent history, after v0.1.0;
    - PR #202 was rebased and merged: ``main`` holds the same change under new SHAs.
    """
    up, pkg = _first_release(root, "0.1.0", ("alpha", "beta"))
    work, bare = up.work, up.bare

    replace_line(pkg / "alpha.py", "alpha line 5\n", "alpha line 5 (fixed by #201)\n")
    pr201 = commit_all(work, "Fix alpha 5")  # committed on main: a fast-forward
    replace_line(pkg / "__init__.py", "0.1.0", "0.2.0")
    commit_all(work, "release 0.2.0")
    git(work, "tag", "v0.2.0")
    up.tags["v0.2.0"] = git(work, "rev-parse", "HEAD")

    git(work, "checkout", "-q", "-b", "pr202")
    replace_line(pkg / "beta.py", "beta line 3\n", "beta line 3 (fixed by #202)\n")
    commit_all(work, "Fix beta 3")
    replace_line(pkg / "beta.py", "beta line 4\n", "beta line 4 (fixed by #202)\n")
    pr202 = commit_all(work, "Fix beta 4")
    git(work, "checkout", "-q", "main")
    replace_line(pkg / "alpha.py", "alpha line 20\n", "alpha line 20 (main)\n")
    commit_all(work, "main: unrelated")
    later = {"GIT_COMMITTER_DATE": "2026-02-01T00:00:00Z"}  # rebase-and-merge: new SHAs
    git(work, "cherry-pick", f"{pr202}~1", pr202, env=later)
    replace_line(pkg / "__init__.py", "0.2.0", "0.3.0")
    commit_all(work, "release 0.3.0")
    git(work, "tag", "v0.3.0")
    up.tags["v0.3.0"] = git(work, "rev-parse", "HEAD")

    git(root, "init", "-q", "--bare", str(bare))
    up.push_main()
    up.set_pr(201, pr201)
    up.set_pr(202, pr202)
    return up
