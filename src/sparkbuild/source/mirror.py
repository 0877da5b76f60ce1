"""A cached bare mirror per upstream repository, shared by runs and locked while it changes.

Only what a build needs is fetched: the base branch, tags, the build's ref and the heads of
the PRs it cherry-picks (``refs/pull/N/head``). Network calls retry with backoff; when they
still fail the error names the URL.

A new mirror is a partial clone (``--filter=blob:none``): it holds every commit and tree,
which is all that statuses, fork points and squash detection read, and file contents only
for what is applied, diffed or checked out. :func:`complete` fetches those contents in one
batch before a command needs them (git would otherwise fetch them one file at a time, and a
failed on-demand fetch inside ``git apply`` would read as a conflict). A remote that refuses
filters gets a full fetch, said once; a URL with credentials gets a full mirror, since a
partial one must keep its URL for later fetches. Mirrors made before this stay full.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock
from tenacity import RetryError, Retrying, retry_if_exception

from sparkbuild import cachetrust, console, git, retries, validate
from sparkbuild.console import plural
from sparkbuild.errors import (
    MissingContentsError,
    RemoteError,
    RemoteUnreachableError,
    UsageError,
)
from sparkbuild.redact import redact, strip_userinfo
from sparkbuild.source import mirror_trust

_SHA = re.compile(r"^[0-9a-f]{7,40}\Z")
_INIT = ".init-"  # a mirror being made: NAME.git.init-PID, renamed to NAME.git when done
# Errors that no retry can fix: the remote answered and said no.
_PERMANENT = ("couldn't find remote ref", "not our ref", "invalid refspec")
# The promisor remote of a partial mirror; the filter new mirrors fetch with.
PROMISOR = "origin"
BLOB_FILTER = "blob:none"
# git's words when a server does not allow filters (it then sends everything).
_FILTER_REFUSED = "filtering not recognized by server"


def _slug(url: str) -> str:
    public = strip_userinfo(url)  # a directory name is shown everywhere
    tail = re.sub(r"[^A-Za-z0-9._-]+", "-", public.rstrip("/").rsplit("/", 1)[-1])
    tail = tail.removesuffix(".git") or "repo"
    return f"{tail}-{hashlib.sha256(url.encode()).hexdigest()[:10]}"


def _is_transient(exc: BaseException) -> bool:
    """A failure a retry may fix: not a refusal by the remote, and not a host that cannot be
    reached at all (offline, a retry only makes the failure slower)."""
    return (
        isinstance(exc, git.GitError)
        and not any(marker in exc.stderr for marker in _PERMANENT)
        and retries.unreachable_cause(exc.stderr) is None
    )


def _retrying() -> Retrying:
    return retries.retrying(retry_if_exception(_is_transient), default_attempts=4)


@dataclass(frozen=True)
class RemoteRefs:
    """What ``git ls-remote`` reported: ref name → object (tags peeled to commits)."""

    refs: dict[str, str]

    def pr_head(self, number: int) -> str | None:
        return self.refs.get(f"refs/pull/{number}/head")

    def resolve(self, ref: str) -> str | None:
        for name in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}", ref):
            if name in self.refs:
                return self.refs[name]
        return None


class Mirror:
    def __init__(self, cache_dir: Path, url: str, *, offline: bool = False) -> None:
        try:  # checked where the URL enters too; here so no caller can skip it
            self.url = validate.repo_url(url)
        except ValueError as exc:
            raise UsageError(f"repository URL: {exc}") from exc
        self.shown_url = redact(url)  # for messages: never show credentials
        self.path = cache_dir / "mirrors" / f"{_slug(url)}.git"
        self.offline = offline  # fetch nothing, not even file contents on demand

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive use while refs change; concurrent runs wait here. The mirror cache is
        private (``cachetrust``), and a mirror that is not one sparkbuild made is made again
        (``mirror_trust``)."""
        cachetrust.private_dir(self.path.parent, "the mirror cache")
        with FileLock(str(self.path) + ".lock"):
            self._ensure()
            yield

    def trusted(self) -> bool:
        """Whether the mirror is there and passes its checks, for a command that only reads
        it (``lock --check``); one that fails is said and left alone."""
        if not (self.path / "HEAD").exists():
            return False
        why = mirror_trust.mirror_problem(self.path, self.shown_url)
        if why is not None:
            console.warn(f"the mirror {self.path} is not used: {why}")
        return why is None

    def _ensure(self) -> None:
        if (self.path / "HEAD").exists() or os.path.islink(self.path):
            why = mirror_trust.mirror_problem(self.path, self.shown_url)
            if why is None:
                return
            cachetrust.discard(self.path, "the mirror", why, by="source")
        self._remove_abandoned_inits()
        tmp = self.path.with_name(self.path.name + f"{_INIT}{os.getpid()}")
        try:  # no template: no hooks or other files of the user's git setup in a mirror
            git.run(["init", "--bare", "--quiet", "--template=", "--", str(tmp)])
            self._configure(tmp)
            # Renamed into place last, so an interrupted init never leaves a half-made mirror.
            tmp.rename(self.path)
        except BaseException:  # Ctrl-C and SIGTERM too (the CLI turns it into an interrupt)
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _configure(self, tmp: Path) -> None:
        # Full mirrors fetch by URL, so this is only for humans poking at the cache and no
        # secret is stored. A partial mirror fetches contents on demand from this URL, so it
        # is one only when the URL carries no credentials.
        git.run(["config", "--", "remote.origin.url", self.shown_url], git_dir=tmp)
        git.run(["config", "gc.auto", "0"], git_dir=tmp)  # no gc racing a concurrent reader
        if self.shown_url != self.url:
            console.info(
                f"{self.shown_url}: the URL carries credentials, which a partial mirror would "
                "have to store for later fetches; this mirror fetches everything instead"
            )
            return
        for key, value in (
            ("core.repositoryformatversion", "1"),
            ("extensions.partialClone", PROMISOR),
            (f"remote.{PROMISOR}.promisor", "true"),
            (f"remote.{PROMISOR}.partialCloneFilter", BLOB_FILTER),
        ):
            git.run(["config", "--", key, value], git_dir=tmp)

    def _remove_abandoned_inits(self) -> None:
        """Half-made mirrors of processes that were killed outright (SIGKILL, a power cut);
        called under the mirror's lock, so no live process is still making one."""
        for leftover in self.path.parent.glob(f"{self.path.name}{_INIT}*"):
            pid = leftover.name.rpartition(_INIT)[2]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(leftover, ignore_errors=True)

    @property
    def partial(self) -> bool:
        return is_partial(self.path)

    def ls_remote(self, patterns: list[str]) -> RemoteRefs:
        output = _network(
            self.path, ["ls-remote", "--", self.url, *patterns], "list refs of", self.shown_url
        ).stdout.decode(errors="replace")
        refs: dict[str, str] = {}
        for line in output.splitlines():
            sha, _, name = line.partition("\t")
            refs[name] = sha
        return RemoteRefs(refs)

    def fetch(self, refspecs: list[str]) -> None:
        if not refspecs:
            return
        # A partial mirror fetches through its promisor remote (a fetch by URL with a filter
        # would record the URL as a remote of its own); a full one by URL, as it always has.
        filtered = _config(self.path, f"remote.{PROMISOR}.partialCloneFilter")
        source = PROMISOR if self.partial else self.url
        what = f"fetching {len(refspecs)} ref(s) from {self.shown_url}"
        if filtered:
            what += " (commits and trees; file contents as needed)"
        with console.status(what) as update:
            result = _network(
                self.path,
                [
                    "fetch",
                    *_progress_flag(),
                    "--no-write-fetch-head",
                    "--tags",
                    "--force",
                    *([f"--filter={filtered}"] if filtered else []),
                    "--",
                    source,
                    *refspecs,
                ],
                "fetch from",
                self.shown_url,
                on_progress=update,
            )
        if filtered and _FILTER_REFUSED in result.stderr.decode(errors="replace"):
            # Everything came anyway. Later fetches ask for all of it, so this is said once.
            git.run(
                ["config", "--unset", f"remote.{PROMISOR}.partialCloneFilter"], git_dir=self.path
            )
            console.info(
                f"{self.shown_url} does not allow partial fetches (uploadpack.allowFilter): "
                "fetched the whole history; this mirror stays full"
            )

    def complete(self, tree: str, paths: Sequence[str] | None = None) -> None:
        """Fetch the contents ``tree`` holds at ``paths`` (all, when None) that the mirror
        lacks, in one batch; an offline mirror refuses instead."""
        complete(self.path, tree, paths, offline=self.offline)

    def local_refs(self) -> RemoteRefs:
        """The PR heads the mirror holds, in ``ls-remote`` form, for offline ``--locked`` runs
        (``lock --check``); the pinned base commit needs no ref."""
        output = git.text(
            ["for-each-ref", "--format=%(refname) %(objectname)", "refs/pull"], git_dir=self.path
        )
        refs: dict[str, str] = {}
        for line in output.splitlines():
            name, _, sha = line.partition(" ")
            refs[name] = sha
        return RemoteRefs(refs)

    def has_commit(self, sha: str) -> bool:
        result = git.run(
            ["cat-file", "-e", "--end-of-options", f"{sha}^{{commit}}"],
            git_dir=self.path,
            check=False,
        )
        return result.returncode == 0

    def rev_parse(self, ref: str) -> str | None:
        result = git.run(
            ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"],
            git_dir=self.path,
            check=False,
        )
        return result.stdout.decode().strip() if result.returncode == 0 else None


def _network(
    git_dir: Path,
    args: list[str],
    what: str,
    shown_url: str,
    *,
    input: bytes | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """A git command that talks to a remote: retried while the failure may pass; a host
    found unreachable earlier in this run is not asked again."""
    earlier = retries.unreachable(shown_url)
    if earlier is not None:
        raise _unreachable(what, shown_url, earlier, again=True)
    try:
        for attempt in _retrying():
            with attempt:
                if on_progress is not None and "--progress" in args:
                    return git.run_with_progress(
                        args, git_dir=git_dir, input=input, on_progress=_shorten(on_progress)
                    )
                return git.run(args, git_dir=git_dir, input=input)
    except RetryError as exc:
        last = exc.last_attempt.exception()
        detail = last.stderr if isinstance(last, git.GitError) else str(last)
        raise RemoteError(
            f"cannot {what} {shown_url}: {redact(_first_line(detail))}",
            f"check the URL and your network, or point the engine elsewhere with "
            f"--repo ENGINE=URL (tried {plural(exc.last_attempt.attempt_number, 'time')})",
        ) from exc
    except git.GitError as exc:
        cause = retries.unreachable_cause(exc.stderr)
        if cause is not None:
            retries.remember_unreachable(shown_url, cause)
            raise _unreachable(what, shown_url, cause, again=False) from exc
        detail = redact(exc.stderr)
        raise RemoteError(f"cannot {what} {shown_url}: {detail}") from exc
    raise AssertionError("unreachable")


def _unreachable(what: str, shown_url: str, cause: str, *, again: bool) -> RemoteUnreachableError:
    host = retries.host_of(shown_url)
    when = "found earlier in this run; not asked again" if again else "not retried"
    return RemoteUnreachableError(
        f"cannot {what} {shown_url}: {host} {cause} ({when})",
        "check your network and DNS; offline, fetch from a local mirror or repository for "
        'this run with --repo ENGINE=PATH (docs/source.md, "Working offline")',
        url=shown_url,
        cause=f"{host} {cause}",
    )


def _progress_flag() -> list[str]:
    """git's own progress meter when someone watches (shown in the spinner), else none."""
    return ["--progress"] if console.interactive() else ["--quiet"]


_METER = re.compile(r"^(?:remote: )?([A-Za-z ]+):\s+(\d+%.*?)(?:, done\.)?\s*\Z")


def _shorten(update: Callable[[str], None]) -> Callable[[str], None]:
    """git's meter lines ("Receiving objects:  42% (420/1000), 12.00 MiB | 3.00 MiB/s") as
    spinner details; other lines (ref updates, remote chatter) are not progress."""

    def shown(line: str) -> None:
        match = _METER.match(line)
        if match:
            update(f"{match.group(1).lower()} {match.group(2)}")

    return shown


def trusted_mirrors(cache_dir: Path) -> list[Path]:
    """The mirrors in the cache that pass ``mirror_trust.mirror_problem`` (any URL), for
    commands that read the cache without making mirrors."""
    root = cache_dir / "mirrors"
    if not root.is_dir() or cachetrust.chain_problem(root) is not None:
        return []
    return [
        path for path in sorted(root.glob("*.git")) if mirror_trust.mirror_problem(path) is None
    ]


def is_partial(git_dir: Path) -> bool:
    """Whether the repository at ``git_dir`` is a partial clone (file contents on demand)."""
    return bool(_config(git_dir, "extensions.partialClone"))


def _config(git_dir: Path, key: str) -> str:
    result = git.run(["config", "--get", "--", key], git_dir=git_dir, check=False)
    return result.stdout.decode(errors="replace").strip() if result.returncode == 0 else ""


def missing_objects(git_dir: Path, tree: str) -> set[str]:
    """The objects under ``tree`` that a partial mirror has not fetched (none in a full one)."""
    if not is_partial(git_dir):
        return set()
    listed = git.text(
        ["rev-list", "--objects", "--missing=print", "--end-of-options", tree], git_dir=git_dir
    )
    return {line[1:] for line in listed.splitlines() if line.startswith("?")}


def _blobs_at(git_dir: Path, tree: str, paths: Sequence[str]) -> set[str]:
    listed = git.run(
        ["ls-tree", "-r", "-z", "--full-tree", "--end-of-options", tree, "--", *paths],
        git_dir=git_dir,
    ).stdout.decode(errors="replace")
    found = set()
    for record in listed.split("\0"):
        meta, _, _path = record.partition("\t")
        fields = meta.split()
        if len(fields) == 3 and fields[1] == "blob":
            found.add(fields[2])
    return found


def complete(
    git_dir: Path, tree: str, paths: Sequence[str] | None = None, *, offline: bool = False
) -> None:
    """Make the contents of ``tree`` (only at ``paths``, when given) present in a partial
    mirror: one fetch of exactly the missing blobs from its promisor remote. A full mirror,
    or a tree already complete, costs one ``git config`` (and one tree walk)."""
    if paths is not None and not paths:
        return
    wanted = missing_objects(git_dir, f"{tree}^{{tree}}")
    if wanted and paths is not None:
        wanted &= _blobs_at(git_dir, tree, paths)
    if not wanted:
        return
    url = _config(git_dir, f"remote.{PROMISOR}.url")
    shown = redact(url)
    if offline:
        raise MissingContentsError(
            f"the mirror of {shown} lacks the contents of {len(wanted)} file(s) this needs "
            "(a partial mirror fetches them when first used), and this run is offline",
            "run it once online (`sparkbuild prepare --locked BUILD` fetches them)",
        )
    with console.status(f"fetching {len(wanted)} file(s) from {shown}") as update:
        _network(
            git_dir,
            [
                # What git runs itself for a missing object, for all of them in one go.
                *("-c", "fetch.negotiationAlgorithm=noop", "fetch", *_progress_flag()),
                *("--no-tags", "--no-write-fetch-head", "--recurse-submodules=no"),
                *(f"--filter={BLOB_FILTER}", "--stdin", "--", PROMISOR),
            ],
            "fetch file contents from",
            shown,
            input="".join(f"{oid}\n" for oid in sorted(wanted)).encode(),
            on_progress=update,
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _first_line(stderr: str) -> str:
    """git's own reason, e.g. "fatal: unable to access ...", without the advice after it."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    fatal = [line for line in lines if line.startswith(("fatal:", "error:"))]
    return (fatal or lines or ["failed"])[0]


def looks_like_sha(ref: str) -> bool:
    return bool(_SHA.match(ref))
