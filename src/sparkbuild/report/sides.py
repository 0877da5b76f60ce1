"""What ``BUILD@WHERE`` names: one build's lock entry, from the lock as it is, from the lock
at a git revision, or from the build's publish history.

- ``BUILD``: the lock as it is now (``--lock-file``, default ``PROJECT/images.lock``);
- ``BUILD@REV``: the lock at git revision ``REV`` of the repository that holds it
  (``git show REV:images.lock``): ``HEAD``, ``HEAD~2``, a tag, a branch, a commit;
- ``BUILD@published`` and ``BUILD@published~N``: the newest image the build published, and
  the Nth before it (distinct images, in the order of the publish history), read from the
  newest revision of the lock that pins that image.
"""

from __future__ import annotations

import functools
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from sparkbuild import git, lockfile, yamlfile
from sparkbuild.errors import BadYAMLError, ReportError

_PUBLISHED = re.compile(r"^published(?:~(\d+))?\Z")
# What git accepts as a revision, minus anything that could be read as an option or a path.
_REVISION = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/~^{}@-]*\Z")
HISTORY_LIMIT = 200  # revisions of the lock searched for a published image
LIST_HINT = "`git log --oneline -- images.lock` lists the revisions that changed the lock"


@dataclass(frozen=True)
class Side:
    """One side of a diff: a build's entry and where it was read."""

    given: str  # as the user wrote it
    build: str
    where: str  # in words, for the page
    entry: lockfile.BuildEntry
    commit: str | None = None  # the lock's revision, when read from git
    note: str | None = None  # what could not be read


@dataclass
class LockHistory:
    """The lock file's git history, read on demand and cached."""

    lock_path: Path
    current: lockfile.LockFile
    _relative: str | None = None
    _entries: dict[tuple[str, str], tuple[lockfile.BuildEntry | None, list[str]]] = field(
        default_factory=dict
    )
    _texts: dict[str, str] = field(default_factory=dict)
    _log: list[str] | None = None

    def _git(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return git.run(list(args), cwd=self.lock_path.parent, check=False)

    def relative(self) -> str:
        """The lock's path inside its repository."""
        if self._relative is None:
            done = self._git("rev-parse", "--show-toplevel")
            if done.returncode != 0:
                raise ReportError(
                    f"{self.lock_path} is not in a git repository, so it has no revisions",
                    "commit images.lock (git add images.lock && git commit), or compare two "
                    "builds of the lock as it is: sparkbuild report --diff BUILD_A BUILD_B",
                )
            top = Path(done.stdout.decode().strip())
            self._relative = self.lock_path.resolve().relative_to(top.resolve()).as_posix()
        return self._relative

    def commit_of(self, revision: str) -> str:
        self.relative()  # not in a repository: that error, not "no such revision"
        if not _REVISION.match(revision):
            raise ReportError(
                f"{revision!r} is not a git revision (letters, digits and ._/~^-)", LIST_HINT
            )
        done = self._git(
            "rev-parse", "--verify", "--quiet", "--end-of-options", f"{revision}^{{commit}}"
        )
        if done.returncode != 0:
            raise ReportError(
                f"no revision {revision!r} in the repository of {self.lock_path}", LIST_HINT
            )
        return done.stdout.decode().strip()

    def text_at(self, commit: str) -> str | None:
        """The lock's text at ``commit`` (None: it has none there); a revision over the
        lock's limit is a ReportError, found before it is read."""
        if commit not in self._texts:
            where = f"{commit}:{self.relative()}"
            size = self._git("cat-file", "-s", where)
            if size.returncode != 0:
                return None
            if int(size.stdout or 0) > lockfile.LOCK_LIMIT:
                error = lockfile.too_large(self.lock_path, int(size.stdout), f"at {commit[:12]} is")
                raise ReportError(error.message, error.hint)
            done = self._git("show", where)
            if done.returncode != 0:
                return None
            if sum(map(len, self._texts.values())) > 4 * lockfile.LOCK_LIMIT:
                self._texts.clear()  # a long history of large locks: read again, not kept
            self._texts[commit] = done.stdout.decode("utf-8", errors="replace")
        return self._texts[commit]

    def entry_at(
        self, commit: str, revision: str, build: str
    ) -> tuple[lockfile.BuildEntry | None, list[str]]:
        """``build``'s entry in the lock at ``commit``, and the builds that lock has."""
        if (commit, build) not in self._entries:
            text = self.text_at(commit)
            if text is None:
                raise ReportError(
                    f"{self.relative()} does not exist at {revision} ({commit[:12]})", LIST_HINT
                )
            where = f"{self.relative()} at {revision}"
            self._entries[commit, build] = parse_entry(text, build, where)
        return self._entries[commit, build]

    def revisions(self) -> list[str]:
        """The commits that changed the lock, newest first (at most HISTORY_LIMIT)."""
        if self._log is None:
            done = self._git("log", f"-n{HISTORY_LIMIT}", "--format=%H", "--", self.relative())
            self._log = done.stdout.decode().split() if done.returncode == 0 else []
        return self._log

    def find_image(self, build: str, image_id: str) -> tuple[str, lockfile.BuildEntry] | None:
        """The newest revision whose lock pins ``image_id`` for ``build``."""
        pinned = f"  image_id: {image_id}\n"  # as sparkbuild writes it under `image:`
        for commit in self.revisions():
            try:
                text = self.text_at(commit)
            except ReportError:
                continue  # a revision too large to read is not searched
            if text is None or image_id not in text:  # most revisions: no parse needed
                continue
            block = _block(text, build)
            if block is not None and pinned not in _section(block, "image"):
                continue  # the id is there, in an older image's records: not this revision
            try:
                entry, _ = self.entry_at(commit, commit[:12], build)
            except ReportError:
                continue  # a revision this sparkbuild cannot read is not the one
            if entry is not None and entry.image and entry.image.image_id == image_id:
                return commit, entry
        return None


# A lock sparkbuild wrote is canonical YAML (lockfile.dumps): its builds are the keys two
# spaces in under `builds:`, each entry the lines indented further.
_BUILD_KEY = re.compile(r"^  ([A-Za-z0-9._-]+):$", re.M)
_NEXT_KEY = re.compile(r"(?:  )?[^ \n]")


def parse_entry(text: str, build: str, where: str) -> tuple[lockfile.BuildEntry | None, list[str]]:
    """``build``'s entry of a lock read from git, and the lock's build names. Only that
    entry's lines are parsed when the text is laid out as sparkbuild writes it (a lock of
    many builds and revisions is otherwise parsed whole for each); any other layout is
    parsed whole. Either way the entry is held to this sparkbuild's schema."""
    body = _block(text, build)
    if body is not None:
        try:
            data, _ = yamlfile.parse_yaml(body.encode("utf-8"))
            entry = lockfile.BuildEntry.model_validate(data)
        except (BadYAMLError, ValidationError):
            pass  # not as sparkbuild writes it after all: read it whole, for its errors
        else:
            return entry, list(_build_names(text))
    lock = parse_lock(text, where)
    return lock.entry(build), list(lock.builds)


@functools.lru_cache(maxsize=8)
def _build_names(text: str) -> tuple[str, ...]:
    return tuple(_BUILD_KEY.findall(_builds_section(text) or ""))


# One revision's text is read for every build of the lock: its builds section is found once.
@functools.lru_cache(maxsize=8)
def _builds_section(text: str) -> str | None:
    """The lines under the top-level ``builds:`` key (none other holds build entries; a
    hand-added top-level key may hold look-alikes)."""
    found = re.search(r"^builds:\n((?:(?: .*)?\n)*)", text, re.M)
    return found.group(1) if found else None


def _block(text: str, build: str) -> str | None:
    """``build``'s entry, dedented, when ``text`` is laid out as sparkbuild writes it."""
    return _blocks(text).get(build)


# An entry's key two spaces in, then its lines, each four spaces in (a 4-space line cannot be
# taken for a key, so one pass finds every entry a search per build would).
_ENTRY = re.compile(r"^  ([^ \n].*):\n((?:    .*\n)+)", re.M)


# One revision's text is read for every build of the lock: its entries are found in one pass,
# not searched for from the top once per build.
@functools.lru_cache(maxsize=8)
def _blocks(text: str) -> dict[str, str | None]:
    """Each key's entry under ``builds:`` (the first one, as a search would find it), dedented;
    None where the lines after it are not laid out as sparkbuild writes them."""
    builds = _builds_section(text)
    found: dict[str, str | None] = {}
    for entry in _ENTRY.finditer(builds or ""):
        laid_out = entry.end() == len(entry.string) or _NEXT_KEY.match(entry.string, entry.end())
        body = "\n".join(line[4:] for line in entry[2].split("\n")) if laid_out else None
        found.setdefault(entry[1], body)
    return found


def _section(block: str, name: str) -> str:
    """One top-level section of an entry's text (a quick look, before any parse)."""
    found = re.search(rf"^{name}:\n((?:  .*\n)*)", block, re.M)
    return found.group(1) if found else ""


def parse_lock(text: str, where: str) -> lockfile.LockFile:
    """A lock read from git: held to this sparkbuild's schema, errors naming ``where``."""
    try:
        data, _ = yamlfile.parse_yaml(text.encode("utf-8"))
        return lockfile.LockFile.model_validate(data or {})
    except (BadYAMLError, ValidationError) as exc:
        detail = exc.problem if isinstance(exc, BadYAMLError) else str(exc).splitlines()[0]
        raise ReportError(
            f"{where} does not load with this sparkbuild's lock schema: {detail}",
            f"pick a newer revision ({LIST_HINT})",
        ) from None


def published_images(entry: lockfile.BuildEntry) -> list[str]:
    """The distinct image ids the build published, newest first (with several repositories,
    their histories in the order of their names)."""
    found: list[str] = []
    for _, record in sorted((entry.publish or {}).items()):
        for publication in reversed(record.history):
            if publication.image_id and publication.image_id not in found:
                found.append(publication.image_id)
    return found


def previous_published(entry: lockfile.BuildEntry) -> str | None:
    """The newest published image that is not the one the lock pins now."""
    current = entry.image.image_id if entry.image else None
    return next((i for i in published_images(entry) if i != current), None)


def _entry(lock: lockfile.LockFile, build: str, where: str) -> lockfile.BuildEntry:
    return _found(lock.entry(build), list(lock.builds), build, where)


def _found(
    entry: lockfile.BuildEntry | None, names: list[str], build: str, where: str
) -> lockfile.BuildEntry:
    if entry is None:
        known = ", ".join(sorted(names)) or "none"
        raise ReportError(
            f"build {build!r} is not in {where} (builds there: {known})",
            "name a build of that lock, or another revision (" + LIST_HINT + ")",
        )
    return entry


def resolve(given: str, history: LockHistory) -> Side:
    """The side ``BUILD[@WHERE]`` names."""
    build, at, where = given.partition("@")
    if not build:
        raise ReportError(
            f"{given!r} names no build", "write BUILD, BUILD@REV or BUILD@published~N"
        )
    if not at:
        return Side(
            given,
            build,
            history.lock_path.name,
            _entry(history.current, build, history.lock_path.name),
        )
    published = _PUBLISHED.match(where)
    if published:
        return _published(given, build, int(published.group(1) or 0), history)
    commit = history.commit_of(where)
    name = f"{history.relative()} at {where}" + ("" if where == commit else f" ({commit[:12]})")
    entry, names = history.entry_at(commit, where, build)
    return Side(given, build, name, _found(entry, names, build, name), commit)


def _published(given: str, build: str, back: int, history: LockHistory) -> Side:
    images = published_images(_entry(history.current, build, history.lock_path.name))
    if back >= len(images):
        raise ReportError(
            f"{build} has {len(images)} published images in {history.lock_path.name}; "
            f"{given} asks for number {back + 1}, counting from the newest",
            f"`sparkbuild publish {build}` publishes one; BUILD@REV names any locked revision",
        )
    return side_for_image(given, build, images[back], history)


def side_for_image(given: str, build: str, image_id: str, history: LockHistory) -> Side:
    """The lock entry that pinned ``image_id``: the lock as it is, else its newest revision
    in git that does; else only what the publish history keeps of it (with a note)."""
    current = history.current.entry(build)
    if current and current.image and current.image.image_id == image_id:
        return Side(given, build, history.lock_path.name, current)
    try:
        found = history.find_image(build, image_id)
    except ReportError:
        found = None
    if found is not None:
        commit, entry = found
        return Side(given, build, f"{history.lock_path.name} at {commit[:12]}", entry, commit)
    note = (
        f"no revision of {history.lock_path.name} in git pins image {image_id[:19]} (in CI, "
        "check out with fetch-depth: 0); only its publish record is shown"
    )
    publish = {
        repository: lockfile.PublishRecord(
            tag=publication.tag,
            digest=publication.digest,
            image_id=image_id,
            verified=publication.verified,
            history=[publication],
        )
        for repository, record in ((current.publish if current else None) or {}).items()
        for publication in record.history
        if publication.image_id == image_id
    }
    entry = lockfile.BuildEntry(image=lockfile.ImageSection(image_id=image_id), publish=publish)
    return Side(given, build, "the publish history", entry, note=note)
