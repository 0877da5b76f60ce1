"""Applying diffs to a tree without a working copy, and saying exactly why one does not apply.

A :class:`ScratchIndex` is a private git index on top of the mirror's objects: applying a
diff with ``git apply --cached`` writes only new blobs, so a repository with thousands of
files is patched without checking it out. Diffs apply exactly (no fuzz). On a partial mirror
the files a diff touches are fetched first, in one batch (see :func:`mirror.complete`).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from sparkbuild import git
from sparkbuild.source.mirror import complete

_HUNK = re.compile(rb"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@.*$", re.M)
_FILE_HEADER = re.compile(rb"^diff --git a/(\S+) b/(\S+)", re.M)


@dataclass(frozen=True)
class ApplyOutcome:
    ok: bool
    message: str


@dataclass(frozen=True)
class FailedHunk:
    path: str
    header: str  # "@@ -10,7 +10,8 @@ def f():" or "(whole file)"

    def __str__(self) -> str:
        return f"{self.path} {self.header}"


class ScratchIndex:
    """A temporary index seeded from a commit; discarded on exit."""

    def __init__(self, git_dir: Path, commit: str, *, offline: bool = False) -> None:
        self.git_dir = git_dir
        self.commit = commit
        self.offline = offline
        self._tmp = tempfile.TemporaryDirectory(prefix="sparkbuild-index-")
        self.env = {"GIT_INDEX_FILE": str(Path(self._tmp.name) / "index")}
        git.run(["read-tree", "--end-of-options", commit], git_dir=git_dir, env=self.env)
        # Paths whose contents are known to be present. A path an applied diff touched was
        # completed first, and what the apply wrote is local, so only new paths are checked.
        self._present: set[str] = set()

    def __enter__(self) -> ScratchIndex:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._tmp.cleanup()

    def _apply(self, diff: bytes, *flags: str) -> ApplyOutcome:
        renamed_from = [m.group(1).decode(errors="replace") for m in _FILE_HEADER.finditer(diff)]
        touched = dict.fromkeys([*renamed_from, *self.files(diff)])
        wanted = [path for path in touched if path not in self._present]
        if wanted:
            complete(self.git_dir, self.commit, wanted, offline=self.offline)
            self._present.update(wanted)
        result = git.run(
            ["apply", "--cached", "--whitespace=nowarn", *flags, "-"],
            git_dir=self.git_dir,
            env=self.env,
            input=diff,
            check=False,
        )
        return ApplyOutcome(result.returncode == 0, result.stderr.decode(errors="replace").strip())

    def applies(self, diff: bytes) -> ApplyOutcome:
        return self._apply(diff, "--check")

    def reverse_applies(self, diff: bytes) -> ApplyOutcome:
        return self._apply(diff, "--check", "--reverse")

    def apply(self, diff: bytes) -> ApplyOutcome:
        return self._apply(diff)

    def diff_problem(self, diff: bytes) -> str | None:
        """Why ``diff`` is not a usable diff at all (None when git can read it).

        An HTML error page, an empty or truncated download or random bytes must never pass
        for "nothing to apply"."""
        if not diff.strip():
            return "the file is empty, not a diff"
        result = git.run(
            ["apply", "--numstat", "--summary", "-"], git_dir=self.git_dir, input=diff, check=False
        )
        if result.returncode != 0:
            reason = result.stderr.decode(errors="replace").strip().splitlines()
            return f"not a valid diff: {reason[0] if reason else 'git apply cannot read it'}"
        lines = result.stdout.decode(errors="replace").splitlines()
        if not lines:
            return "not a valid diff: it changes no file"
        empty = [path for path, header, hunks in split_diff(diff) if _header_only(header, hunks)]
        if empty:
            return f"not a valid diff: {empty[0]} has a file header but no hunk"
        return None

    def files(self, diff: bytes) -> list[str]:
        """Paths the diff touches, as git reads them (any unified diff format)."""
        headers = [m.group(2).decode(errors="replace") for m in _FILE_HEADER.finditer(diff)]
        if headers:  # git-style diff: no need to ask git
            return list(dict.fromkeys(headers))
        result = git.run(
            ["apply", "--numstat", "-z", "-"], git_dir=self.git_dir, input=diff, check=False
        )
        if result.returncode != 0:
            return []
        paths: list[str] = []
        for record in result.stdout.decode(errors="replace").split("\0"):
            path = record.split("\t")[-1].strip()
            if path and path not in paths:
                paths.append(path)
        return paths

    def read(self, path: str) -> tuple[str, bytes] | None:
        """(mode, bytes) of ``path`` in the index, or None when there is no such file."""
        listed = git.text(["ls-files", "-s", "--", path], git_dir=self.git_dir, env=self.env)
        fields = listed.split(None, 3)
        if len(fields) < 4 or fields[3] != path or fields[0] == "160000":
            return None
        if path not in self._present:
            complete(self.git_dir, self.commit, [path], offline=self.offline)
            self._present.add(path)
        data = git.run(["cat-file", "blob", fields[1]], git_dir=self.git_dir).stdout
        return fields[0], data

    def write(self, path: str, mode: str, data: bytes) -> None:
        """Put ``data`` at ``path`` in the index (a new blob in the mirror)."""
        written = git.run(["hash-object", "-w", "--stdin"], git_dir=self.git_dir, input=data)
        blob = written.stdout.decode().strip()
        git.run(
            ["update-index", "--cacheinfo", f"{mode},{blob},{path}"],
            git_dir=self.git_dir,
            env=self.env,
        )
        self._present.add(path)

    def write_tree(self) -> str:
        # --missing-ok: every entry came from a tree of the mirror (or an apply); on a partial
        # mirror, checking each would fetch the contents of the whole tree.
        return git.text(["write-tree", "--missing-ok"], git_dir=self.git_dir, env=self.env)

    def failed_hunks(self, diff: bytes) -> list[FailedHunk]:
        """Each hunk checked on its own, so a conflict names the hunks that do not fit."""
        failed: list[FailedHunk] = []
        for path, header, hunks in split_diff(diff):
            if not hunks:
                if not self.applies(header).ok:
                    failed.append(FailedHunk(path, "(whole file)"))
                continue
            for hunk in hunks:
                if not self.applies(header + hunk).ok:
                    title = hunk.split(b"\n", 1)[0].decode(errors="replace")
                    failed.append(FailedHunk(path, title))
        return failed


_PLAIN_HEADER = re.compile(rb"^--- (\S+)[^\n]*\n\+\+\+ (\S+)", re.M)


def _plain_path(old: bytes, new: bytes) -> str:
    """The path a ``diff -u`` section names (``-p1``: the first component dropped)."""
    chosen = new if new != b"/dev/null" else old
    text = chosen.decode(errors="replace")
    return text.split("/", 1)[1] if "/" in text else text


def _sections(diff: bytes) -> list[tuple[int, str]]:
    """Where each file's section starts and its path, for git-style and plain diffs."""
    git_style = [
        (m.start(), m.group(2).decode(errors="replace")) for m in _FILE_HEADER.finditer(diff)
    ]
    if git_style:
        return git_style
    return [(m.start(), _plain_path(m.group(1), m.group(2))) for m in _PLAIN_HEADER.finditer(diff)]


# What a git file section may say instead of hunks: a mode change, a new or deleted empty
# file, a rename or copy, a binary change.
_WITHOUT_HUNKS = re.compile(
    rb"^(?:new file mode|deleted file mode|old mode|new mode|rename from|copy from"
    rb"|similarity index|Binary files|GIT binary patch)",
    re.M,
)


def _header_only(header: bytes, hunks: list[bytes]) -> bool:
    """A file section that names a file but changes nothing in it (a cut download)."""
    return not hunks and not _WITHOUT_HUNKS.search(header)


def split_diff(diff: bytes) -> list[tuple[str, bytes, list[bytes]]]:
    """(path, file header, [hunks]) for each file of a git-style or plain unified diff."""
    found = _sections(diff)
    starts = [start for start, _ in found]
    sections: list[tuple[str, bytes, list[bytes]]] = []
    for (begin, path), end in zip(found, [*starts[1:], len(diff)], strict=True):
        section = diff[begin:end]
        hunk_starts = [m.start() for m in _HUNK.finditer(section)]
        if not hunk_starts or b"GIT binary patch" in section:
            sections.append((path, section, []))
            continue
        header = section[: hunk_starts[0]]
        hunks = [
            section[a:b] for a, b in zip(hunk_starts, [*hunk_starts[1:], len(section)], strict=True)
        ]
        sections.append((path, header, hunks))
    return sections
