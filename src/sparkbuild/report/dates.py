"""When each record of images.lock was committed: ``git blame`` of the lock, read per record.

The lock keeps no dates of its own (bench runs excepted: ``created``), but it is a committed
file written in canonical YAML, one key per line: the newest commit among the lines of a
record is when that record last changed. One ``git blame`` of the file gives every line's
commit; the YAML node tree gives each record's lines. Lines changed since the last commit
are "uncommitted"; a lock outside a git work tree has no dates at all (the report says so).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import yaml

from sparkbuild import git

UNCOMMITTED = "0" * 40
Path_ = tuple[str, ...]  # a record's keys from the top: ("builds", NAME, "smoke", ID, PROFILE)


@dataclass(frozen=True)
class RecordDate:
    """When a record last changed: a commit's time, or not committed yet."""

    when: datetime | None  # None: uncommitted
    commit: str | None = None

    @property
    def text(self) -> str:
        return self.when.strftime("%Y-%m-%d") if self.when else "uncommitted"

    def age_days(self, now: datetime) -> float | None:
        return (now - self.when).total_seconds() / 86400 if self.when else None

    @classmethod
    def parse(cls, created: str | None) -> RecordDate | None:
        """A record's own timestamp (bench ``created``, ISO 8601), when it has one."""
        if not created:
            return None
        try:
            when = datetime.fromisoformat(created.replace("Z", "+00:00"))
        except ValueError:
            return None
        return cls(when if when.tzinfo else when.replace(tzinfo=UTC))


@dataclass(frozen=True)
class LockDates:
    """Each line's commit time, and each record's line range."""

    lines: tuple[RecordDate, ...]  # index: line number - 1
    ranges: dict[Path_, tuple[int, int]]  # record -> (first, last) line, 0-based, inclusive
    note: str | None = None  # why there are no dates, when there are none

    def of(self, *keys: str) -> RecordDate | None:
        """The newest change among the record's lines (uncommitted beats any commit)."""
        span = self.ranges.get(keys)
        if span is None or not self.lines:
            return None
        dates = self.lines[span[0] : span[1] + 1]
        if not dates:
            return None
        if any(d.when is None for d in dates):
            return RecordDate(None)
        return max(dates, key=lambda d: d.when or datetime.min.replace(tzinfo=UTC))


def no_dates(note: str) -> LockDates:
    return LockDates((), {}, note)


def lock_dates(lock_path: Path, text: str) -> LockDates:
    """The dates of ``lock_path`` (whose content is ``text``) from ``git blame``."""
    return tree_dates(lock_path, _compose(text))


def tree_dates(lock_path: Path, tree: yaml.Node | None) -> LockDates:
    """The dates of ``lock_path``, its records' lines read from ``tree``, the node tree it was
    loaded from (composing a 50-build lock again costs more than blaming it)."""
    lines = _blame(lock_path)
    if isinstance(lines, str):
        return no_dates(lines)
    ranges: dict[Path_, tuple[int, int]] = {}
    _walk(tree, (), ranges)
    return LockDates(lines, ranges)


def _blame(lock_path: Path) -> tuple[RecordDate, ...] | str:
    try:
        result = git.run(
            ["blame", "--incremental", "--", lock_path.name], cwd=lock_path.parent, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"git is not available ({exc}): no dates"
    if result.returncode != 0:
        return (
            f"{lock_path.name} is not committed in a git repository, so the report has no "
            "dates (commit it, then re-run)"
        )
    return _parse_incremental(result.stdout.decode("utf-8", errors="replace"))


# `SHA ORIG_LINE FINAL_LINE COUNT`: a run of lines one commit last changed
_HUNK = re.compile(r"([0-9a-f]{40}) \d+ (\d+) (\d+)")


def _parse_incremental(output: str) -> tuple[RecordDate, ...]:
    """``git blame --incremental``: a header per run of lines (not per line, as --porcelain
    has it: a 50-build lock is 28,000 lines but 4,000 runs), the commit's fields the first
    time it appears, in no particular order of lines."""
    times: dict[str, datetime] = {}
    hunks: list[tuple[str, int, int]] = []
    sha = ""
    for line in output.splitlines():
        hunk = _HUNK.fullmatch(line)
        if hunk:
            sha = hunk[1]
            hunks.append((sha, int(hunk[2]) - 1, int(hunk[3])))
        elif line.startswith("committer-time "):
            times[sha] = datetime.fromtimestamp(int(line.split()[1]), tz=UTC)
    found = [RecordDate(None)] * sum(count for _, _, count in hunks)
    for sha, first, count in hunks:
        date = RecordDate(None) if sha == UNCOMMITTED else RecordDate(times.get(sha), sha)
        found[first : first + count] = [date] * count
    return tuple(found)


def _compose(text: str) -> yaml.Node | None:
    try:
        loader = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader
        return yaml.compose(text, Loader=loader)
    except yaml.YAMLError:
        return None


def _walk(node: yaml.Node | None, path: Path_, ranges: dict[Path_, tuple[int, int]]) -> None:
    """Every mapping value's line range, down to five keys deep (a smoke or bench record)."""
    if not isinstance(node, yaml.MappingNode) or len(path) >= 5:
        return
    for key_node, value_node in node.value:
        key = (*path, str(key_node.value))
        end = value_node.end_mark
        last = end.line - 1 if end.column == 0 else end.line
        ranges[key] = (key_node.start_mark.line, max(last, key_node.start_mark.line))
        _walk(value_node, key, ranges)
