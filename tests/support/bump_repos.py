"""A small upstream whose second release moves, absorbs and breaks our patches, for bump.

History of ``main``::

    v1.0.0 ── merge PR #101 ── "Fix beta 10 (#77)" ── rename old.py → moved.py ── v1.1.0 ── v1.2.0
                                                              (v1.2.0 moves it back) ──┘

Between v1.0.0 and v1.1.0 upstream
- merges PR #101 by a merge commit (its head is in v1.1.0);
- makes the change of ``absorbed.patch`` itself, in a commit titled "... (#77)";
- rewrites the line ``clash.patch`` edits, in other words;
- renames ``old.py`` to ``moved.py`` and edits it elsewhere (``renamed.patch`` edits old.py);
- leaves the line ``kept.patch`` edits alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.support.gitrepos import commit_all, git, lines, make_patch, replace_line

PATCH_HEADER = """sparkbuild patch: {title}

What breaks: nothing real; a test patch for `sparkbuild bump`.
Why this fix: it exercises one decision of bump.
Upstream: the small test repository.
when: "{when}"
"""

SPEC = """# The demo engine (a comment bump must keep).
engine: sglang
repo: https://example.invalid/demo.git
base_branch: main
package_dir: python/pkg

prs:
  # merged upstream before v1.1.0
  - {{number: 101}}

patches:
{patches}

builds:
  # the only build so far
  demo-1.0.0-spark:
    description: v1.0.0 with our patches
    ref: v1.0.0
    base_image: example.invalid/demo:v1.0.0
    patches:
      - {{file: patches/sglang/kept.patch}}
    smoke: [demo-profile]
"""

# name -> (file, old line, new line)
EDITS = {
    "kept": ("python/pkg/alpha.py", "alpha line 20\n", "alpha line 20 (ours)\n"),
    "clash": ("python/pkg/alpha.py", "alpha line 5\n", "alpha line 5 (ours)\n"),
    "renamed": ("python/pkg/old.py", "old line 3\n", "old line 3 (ours)\n"),
    "absorbed": ("python/pkg/beta.py", "beta line 10\n", "beta line 10 (fixed)\n"),
}


@dataclass
class DemoUpstream:
    bare: Path
    work: Path

    @property
    def url(self) -> str:
        return str(self.bare)


def make_demo_upstream(root: Path) -> DemoUpstream:
    work, bare = root / "work", root / "upstream.git"
    pkg = work / "python" / "pkg"
    pkg.mkdir(parents=True)
    git(work, "init", "-q", "-b", "main")
    for name in ("alpha", "beta", "old"):
        (pkg / f"{name}.py").write_text(lines(name))
    commit_all(work, "initial")
    git(work, "tag", "v1.0.0")

    git(work, "checkout", "-q", "-b", "pr101")
    replace_line(pkg / "beta.py", "beta line 25\n", "beta line 25 (#101)\n")
    pr101 = commit_all(work, "pr101: beta 25")
    git(work, "checkout", "-q", "main")
    git(work, "merge", "-q", "--no-ff", "-m", "Merge PR #101", "pr101")

    replace_line(pkg / "beta.py", "beta line 10\n", "beta line 10 (fixed)\n")
    commit_all(work, "Fix beta 10 (#77)")
    replace_line(pkg / "alpha.py", "alpha line 5\n", "alpha line 5 (theirs)\n")
    commit_all(work, "Reword alpha 5")
    git(work, "mv", "python/pkg/old.py", "python/pkg/moved.py")
    replace_line(pkg / "moved.py", "old line 28\n", "old line 28 (after the move)\n")
    commit_all(work, "Move old.py to moved.py")
    git(work, "tag", "v1.1.0")
    replace_line(pkg / "alpha.py", "alpha line 12\n", "alpha line 12 (v1.2.0)\n")
    git(work, "mv", "python/pkg/moved.py", "python/pkg/old.py")  # and back again
    commit_all(work, "release 1.2.0")
    git(work, "tag", "v1.2.0")

    git(root, "init", "-q", "--bare", str(bare))
    git(work, "push", "-q", str(bare), "main", "--tags")
    git(work, "push", "-q", str(bare), f"{pr101}:refs/pull/101/head")
    return DemoUpstream(bare=bare, work=work)


def demo_patch(work: Path, name: str) -> str:
    path, old, new = EDITS[name]
    header = PATCH_HEADER.format(title=name, when=">=1.0.0")
    return make_patch(work, "v1.0.0", {path: (old, new)}, header=header)


def make_demo_project(
    root: Path, upstream: DemoUpstream, spec_level: list[str], extra_builds: str = ""
) -> Path:
    """A git-tracked project: ``kept`` in the build, ``spec_level`` patches for every build."""
    project = root / "project"
    (project / "builds").mkdir(parents=True)
    (project / "patches" / "sglang").mkdir(parents=True)
    for name in EDITS:
        (project / "patches" / "sglang" / f"{name}.patch").write_text(
            demo_patch(upstream.work, name)
        )
    entries = "\n".join(
        f'  - {{file: patches/sglang/{name}.patch, when: ">=1.0.0"}}' for name in spec_level
    )
    spec = SPEC.format(patches=entries or "  []") + extra_builds
    (project / "builds" / "sglang.yaml").write_text(spec)
    git(project, "init", "-q", "-b", "main")
    commit_all(project, "the project before the bump")
    return project


# Files 0.5.12 added over 0.5.11 for Gemma-4 MTP: the stand-in for PR #24436's change.
GEMMA4_MTP_FILES = [
    "python/sglang/srt/models/gemma4_mtp.py",
    "python/sglang/srt/speculative/frozen_kv_mtp_worker.py",
    "python/sglang/srt/speculative/frozen_kv_mtp_info.py",
]


def sglang_upstream_with_pr_24436(releases: Path, root: Path) -> Path:
    """A bare clone of the release repository plus ``refs/pull/24436/head`` (the stand-in:
    the Gemma-4 MTP files of 0.5.12 committed on top of v0.5.11, as in test_shipped_specs)."""
    repo = root / "sglang.git"
    git(root, "clone", "-q", "--bare", str(releases), str(repo))
    work = root / "pr-work"
    git(root, "clone", "-q", "--branch", "v0.5.11", str(repo), str(work))
    git(work, "checkout", "-q", "v0.5.12", "--", *GEMMA4_MTP_FILES)
    git(work, "commit", "-q", "-m", "Gemma-4 MTP (stand-in for PR #24436)")
    git(work, "push", "-q", str(repo), "HEAD:refs/pull/24436/head")
    return repo
