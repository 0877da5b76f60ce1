"""Carrying a change that no longer applies onto a newer release.

The change is first re-made on the release where it last applied (so every blob it needs
is known), then tried on the new release in order of increasing liberty:

1. ``3-way apply``: ``git apply --3way`` of the full-index diff: git's own file merge.
2. ``cherry-pick``: a merge of the change onto the new release with rename detection
   (``git merge-tree``), which follows a file that moved.
3. ``token merge``: git's line merge, and inside each conflicting region a merge word by
   word, so that "we wrapped an operand" and "upstream renamed it" both survive.
4. ``moved code``: the exact lines the change replaces, found once elsewhere in the new
   release (code moved to another file or function), replaced there, re-indented.

Strategies 3 and 4 are heuristics: a Python result must still compile, and the new patch
says how it was made so that a reviewer looks at it.
"""

from __future__ import annotations

import difflib
import re
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from sparkbuild import git
from sparkbuild.errors import BumpError
from sparkbuild.source.mirror import complete
from sparkbuild.source.patching import ScratchIndex

_TOKEN = re.compile(r"\w+|[ \t]+|\n|[^\w\s]")
_OPENERS = ("(", "[", "{")
_MAX_CONFLICT_LINES = 80
_MAX_CANDIDATE_FILES = 50


@dataclass(frozen=True)
class Carried:
    """The outcome of carrying one change; ``diff`` is against the new release when ok."""

    ok: bool
    strategy: str | None
    diff: bytes
    attempts: tuple[str, ...]  # "strategy: why it failed", in the order tried
    conflict_text: str  # the conflicting regions git left, for the conflict report
    full_diff: bytes  # the change with full blob ids, made on the release it last fit
    upstream: bool = False  # the merge changes nothing: the new release already has it


class _FailedError(Exception):
    """One strategy did not work; the message says why."""


def carry_forward(git_dir: Path, diff: bytes, base: str, target: str) -> Carried:
    """Carry ``diff`` (applies to commit ``base``) onto commit ``target``."""
    base_tree = _tree(git_dir, base)
    target_tree = _tree(git_dir, target)
    # The strategies read whole trees (rename detection, grep for moved code): on a partial
    # mirror, fetch both releases' contents in two batches rather than file by file.
    complete(git_dir, base_tree)
    complete(git_dir, target_tree)
    with ScratchIndex(git_dir, base) as index:
        outcome = index.apply(diff)
        if not outcome.ok:
            raise BumpError(f"the change does not apply to {base[:12]}: {outcome.message}")
        ours_tree = index.write_tree()
    full = git.run(
        ["diff", "--full-index", "--binary", base_tree, ours_tree], git_dir=git_dir
    ).stdout
    attempts: list[str] = []
    conflict_text = ""
    strategies: tuple[tuple[str, Callable[[], str]], ...] = (
        ("3-way apply", partial(_three_way_apply, git_dir, full, target)),
        ("cherry-pick (renames followed)", partial(_cherry_pick, git_dir, base, ours_tree, target)),
        ("token merge", partial(_token_merge, git_dir, base_tree, ours_tree, target)),
        ("moved code", partial(_moved_code, git_dir, base_tree, ours_tree, target)),
    )
    for name, strategy in strategies:
        try:
            result_tree = strategy()
        except _FailedError as exc:
            reason = str(exc)
            if name.startswith("cherry-pick") and "\n" in reason:
                reason, _, conflict_text = reason.partition("\n")
            attempts.append(f"{name}: {reason}")
            continue
        new_diff = git.run(["diff", "--binary", target_tree, result_tree], git_dir=git_dir).stdout
        return Carried(True, name, new_diff, tuple(attempts), "", full, upstream=not new_diff)
    return Carried(False, None, b"", tuple(attempts), conflict_text, full)


def _tree(git_dir: Path, commit: str) -> str:
    return git.text(["rev-parse", f"{commit}^{{tree}}"], git_dir=git_dir)


def _three_way_apply(git_dir: Path, full: bytes, target: str) -> str:
    with ScratchIndex(git_dir, target) as index:
        result = git.run(
            ["apply", "--cached", "--3way", "--whitespace=nowarn", "-"],
            git_dir=git_dir,
            env=index.env,
            input=full,
            check=False,
        )
        unmerged = git.text(["ls-files", "-u"], git_dir=git_dir, env=index.env)
        if result.returncode != 0 or unmerged:
            paths = sorted({line.split("\t", 1)[-1] for line in unmerged.splitlines()})
            where = ", ".join(paths) or _last_line(result.stderr)
            raise _FailedError(f"conflicts in {where}")
        return index.write_tree()


def _commit(git_dir: Path, tree: str, parent: str, message: str) -> str:
    return git.text(["commit-tree", tree, "-p", parent, "-m", message], git_dir=git_dir)


def _cherry_pick(git_dir: Path, base: str, ours_tree: str, target: str) -> str:
    # Both sides as children of ``base``, so that the merge base is exactly the release the
    # change was made on (git 2.39's merge-tree has no --merge-base).
    ours = _commit(git_dir, ours_tree, base, "sparkbuild: the change")
    theirs = _commit(git_dir, _tree(git_dir, target), base, "sparkbuild: the new release")
    result = git.run(
        ["merge-tree", "--write-tree", "--name-only", theirs, ours], git_dir=git_dir, check=False
    )
    lines = result.stdout.decode(errors="replace").splitlines()
    if result.returncode == 0 and lines:
        return lines[0]
    if result.returncode != 1 or not lines:
        raise _FailedError(_last_line(result.stderr) or "git merge-tree failed")
    paths = [
        line for line in lines[1:] if line and not line.startswith(("Auto-merging", "CONFLICT"))
    ]
    paths = list(dict.fromkeys(p for p in paths if "\t" not in p and " " not in p))
    regions = [_conflict_regions(git_dir, lines[0], path) for path in paths]
    raise _FailedError(f"conflicts in {', '.join(paths)}\n" + "\n".join(r for r in regions if r))


def _conflict_regions(git_dir: Path, tree: str, path: str) -> str:
    shown = git.run(["cat-file", "-p", f"{tree}:{path}"], git_dir=git_dir, check=False)
    text = shown.stdout.decode(errors="replace")
    out: list[str] = []
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("<<<<<<< "):
            inside = True
            out += [f"--- {path}, line {number}", "<<<<<<< the new release"]
        elif line.startswith(">>>>>>> "):
            inside = False
            out.append(">>>>>>> the change")
        elif inside:
            out.append(line)
        if len(out) > _MAX_CONFLICT_LINES:
            out.append("... (cut)")
            break
    return "\n".join(out)


def _last_line(stderr: bytes) -> str:
    lines = [line for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


# -- file-level helpers ------------------------------------------------------------------


def _changed_paths(git_dir: Path, base_tree: str, ours_tree: str) -> list[tuple[str, str]]:
    raw = git.text(
        ["diff", "--no-renames", "--name-status", "-z", base_tree, ours_tree], git_dir=git_dir
    )
    fields = [f for f in raw.split("\0") if f]
    return [(fields[i][0], fields[i + 1]) for i in range(0, len(fields) - 1, 2)]


def _blob_text(git_dir: Path, tree: str, path: str) -> str | None:
    shown = git.run(["cat-file", "-p", f"{tree}:{path}"], git_dir=git_dir, check=False)
    if shown.returncode != 0:
        return None
    try:
        return shown.stdout.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _write_files(git_dir: Path, target: str, files: dict[str, str]) -> str:
    """The target's tree with ``files`` replaced (modes kept)."""
    with ScratchIndex(git_dir, target) as index:
        for path, text in files.items():
            blob = git.run(
                ["hash-object", "-w", "--stdin"], git_dir=git_dir, input=text.encode("utf-8")
            )
            mode = git.text(["ls-files", "-s", "--", path], git_dir=git_dir, env=index.env)
            git.run(
                [
                    "update-index",
                    "--cacheinfo",
                    f"{mode.split(' ', 1)[0] or '100644'},{blob.stdout.decode().strip()},{path}",
                ],
                git_dir=git_dir,
                env=index.env,
            )
        return index.write_tree()


def _check_compiles(path: str, text: str, reference: str) -> None:
    """A heuristic merge must leave Python that still parses (when upstream's did)."""
    if not path.endswith(".py"):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            compile(reference, path, "exec", dont_inherit=True)
        except SyntaxError:
            return
        try:
            compile(text, path, "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise _FailedError(f"the merged {path} does not compile (line {exc.lineno})") from exc


# -- token merge -------------------------------------------------------------------------


def _token_merge(git_dir: Path, base_tree: str, ours_tree: str, target: str) -> str:
    target_tree = _tree(git_dir, target)
    merged: dict[str, str] = {}
    for status, path in _changed_paths(git_dir, base_tree, ours_tree):
        if status != "M":
            raise _FailedError(f"{path} is added or deleted by the change, not edited")
        base, ours = _blob_text(git_dir, base_tree, path), _blob_text(git_dir, ours_tree, path)
        theirs = _blob_text(git_dir, target_tree, path)
        if base is None or ours is None:
            raise _FailedError(f"{path} is not text")
        if theirs is None:
            raise _FailedError(f"{path} is not in the new release")
        text = _merge_file(base, ours, theirs, path)
        _check_compiles(path, text, theirs)
        merged[path] = text
    return _write_files(git_dir, target, merged)


def _merge_file(base: str, ours: str, theirs: str, path: str) -> str:
    """git's line merge; each conflicting region merged again token by token."""
    with tempfile.TemporaryDirectory(prefix="sparkbuild-merge-") as tmp:
        names = []
        for name, text in (("ours", ours), ("base", base), ("theirs", theirs)):
            file = Path(tmp) / name
            file.write_text(text, encoding="utf-8")
            names.append(str(file))
        result = git.run(
            ["merge-file", "-p", "--diff3", "-L", "o", "-L", "b", "-L", "t", *names], check=False
        )
    if result.returncode < 0 or result.returncode > 127:
        raise _FailedError(f"git merge-file failed on {path}")
    return _resolve_regions(result.stdout.decode("utf-8"), path)


def _resolve_regions(text: str, path: str) -> str:
    out: list[str] = []
    section: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines(keepends=True):
        marker = line.rstrip("\n")
        if marker == "<<<<<<< o":
            current, section = "o", {"o": [], "b": [], "t": []}
        elif marker == "||||||| b" and current == "o":
            current = "b"
        elif marker == "=======" and current == "b":
            current = "t"
        elif marker == ">>>>>>> t" and current == "t":
            joined = {k: "".join(v) for k, v in section.items()}
            resolved = merge_tokens(joined["b"], joined["o"], joined["t"])
            if resolved is None:
                raise _FailedError(f"both sides change the same words in {path}")
            out.append(resolved)
            current = None
        elif current is not None:
            section[current].append(line)
        else:
            out.append(line)
    if current is not None:
        raise _FailedError(f"unreadable merge output for {path}")
    return "".join(out)


def _edits(base: list[str], other: list[str]) -> list[tuple[int, int, list[str]]]:
    matcher = difflib.SequenceMatcher(None, base, other, autojunk=False)
    return [
        (i1, i2, other[j1:j2]) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"
    ]


def merge_tokens(base: str, ours: str, theirs: str) -> str | None:
    """A three-way merge word by word, or None when both sides edit the same words.

    Two insertions at the same point are a clash unless one adds no words; they are then
    ordered so that ours wraps theirs: an insertion of ours that opens a bracket goes
    first, any other after upstream's.
    """
    b = _TOKEN.findall(base)
    mine, upstream = _edits(b, _TOKEN.findall(ours)), _edits(b, _TOKEN.findall(theirs))
    for m in mine:
        for u in upstream:
            if _clash(m, u):
                return None
    keyed: list[tuple[tuple[int, int, int], tuple[int, int, list[str]]]] = []
    for side, edits in (("ours", mine), ("theirs", upstream)):
        for edit in edits:
            i1, i2, repl = edit
            is_insert = i1 == i2
            opener = "".join(repl).strip().endswith(_OPENERS)
            order = (0 if opener else 2) if side == "ours" else 1
            keyed.append(((i1, 0 if is_insert else 1, order), edit))
    keyed.sort(key=lambda pair: pair[0])
    out: list[str] = []
    position = 0
    seen: set[tuple[int, int, str]] = set()
    for _, (i1, i2, repl) in keyed:
        signature = (i1, i2, "".join(repl))
        if signature in seen:  # the same edit on both sides
            continue
        seen.add(signature)
        out.extend(b[position:i1])
        out.extend(repl)
        position = max(position, i2)
    out.extend(b[position:])
    return "".join(out)


def _has_words(tokens: list[str]) -> bool:
    return any(token[0].isalnum() or token[0] == "_" for token in tokens)


def _clash(a: tuple[int, int, list[str]], b: tuple[int, int, list[str]]) -> bool:
    if (a[0], a[1], a[2]) == (b[0], b[1], b[2]):
        return False
    a_insert, b_insert = a[0] == a[1], b[0] == b[1]
    if a_insert and b_insert:
        # Two insertions at one point compete, unless one only adds brackets or operators
        # (upstream turning a name into a call, ``x`` -> ``x()``): ordered by merge_tokens.
        return _has_words(a[2]) and _has_words(b[2])
    if a_insert:
        return b[0] < a[0] < b[1]
    if b_insert:
        return a[0] < b[0] < a[1]
    return a[0] < b[1] and b[0] < a[1]


# -- moved code --------------------------------------------------------------------------

_HUNK0 = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _moved_code(git_dir: Path, base_tree: str, ours_tree: str, target: str) -> str:
    target_tree = _tree(git_dir, target)
    zero = git.run(["diff", "-U0", base_tree, ours_tree], git_dir=git_dir).stdout
    changes = _zero_context_changes(zero.decode("utf-8", errors="replace"))
    if not changes:
        raise _FailedError("no edited lines to look for")
    files: dict[str, list[str]] = {}
    for removed, added in changes:
        if not removed or not any(line.strip() for line in removed):
            raise _FailedError("a pure insertion has no old lines to find in the new release")
        path, start = _find_block(git_dir, target_tree, removed, files)
        lines = files[path]
        shift = _indent(lines[start]) - _indent(removed[0])
        lines[start : start + len(removed)] = [_reindent(line, shift) for line in added]
    merged = {path: "".join(lines) for path, lines in files.items()}
    for path, text in merged.items():
        _check_compiles(path, text, _blob_text(git_dir, target_tree, path) or "")
    return _write_files(git_dir, target, merged)


def _zero_context_changes(diff: str) -> list[tuple[list[str], list[str]]]:
    changes: list[tuple[list[str], list[str]]] = []
    for line in diff.splitlines(keepends=True):
        if _HUNK0.match(line):
            changes.append(([], []))
        elif changes and line.startswith("-") and not line.startswith("--- "):
            changes[-1][0].append(line[1:])
        elif changes and line.startswith("+") and not line.startswith("+++ "):
            changes[-1][1].append(line[1:])
    return changes


def _find_block(
    git_dir: Path, tree: str, removed: list[str], files: dict[str, list[str]]
) -> tuple[str, int]:
    """The one place in ``tree`` holding ``removed`` (compared without indentation)."""
    anchor = next(line.strip() for line in removed if line.strip())
    grep = git.run(["grep", "-l", "-F", "-e", anchor, tree, "--"], git_dir=git_dir, check=False)
    paths = [p.split(":", 1)[1] for p in grep.stdout.decode(errors="replace").splitlines()]
    wanted = [line.strip() for line in removed]
    found: list[tuple[str, int]] = []
    if len(paths) > _MAX_CANDIDATE_FILES:  # too common a line to place the change by
        raise _FailedError(f"the lines it replaces ({anchor[:60]!r}) are in {len(paths)} files")
    for path in paths:
        if path not in files:
            text = _blob_text(git_dir, tree, path)
            if text is None:
                continue
            files[path] = text.splitlines(keepends=True)
        stripped = [line.strip() for line in files[path]]
        for start in range(len(stripped) - len(wanted) + 1):
            if stripped[start : start + len(wanted)] == wanted:
                found.append((path, start))
    if len(found) != 1:
        what = "nowhere" if not found else f"in {len(found)} places"
        raise _FailedError(f"the lines it replaces ({anchor[:60]!r}) are {what} in the new release")
    return found[0]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _reindent(line: str, shift: int) -> str:
    if not line.strip():
        return line
    if shift >= 0:
        return " " * shift + line
    if _indent(line) < -shift:
        raise _FailedError("the moved code is indented less than the change expects")
    return line[-shift:]
