"""A cached bare mirror per upstream repository, shared by runs and locked while it changes.

Only what a build needs is fetched: the base branch, tags, the build's ref and the heads of
the PRs it cherry-picks (``refs/pull/N/head``). Network calls retry with backoff; when they
still fail the error names the URL.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock
from tenacity import RetryError, Retrying, retry_if_exception

from sparkbuild import console, git, retries, validate
from sparkbuild.errors import RemoteError, UsageError

_SHA = re.compile(r"^[0-9a-f]{7,40}$")
_INIT = ".init-"  # a mirror being made: NAME.git.init-PID, renamed to NAME.git when done
# Errors that no retry can fix: the remote answered and said no.
_PERMANENT = ("couldn't find remote ref", "not our ref", "invalid refspec")


def _slug(url: str) -> str:
    public = validate.strip_userinfo(url)  # a directory name is shown everywhere
    tail = re.sub(r"[^A-Za-z0-9._-]+", "-", public.rstrip("/").rsplit("/", 1)[-1])
    tail = tail.removesuffix(".git") or "repo"
    return f"{tail}-{hashlib.sha256(url.encode()).hexdigest()[:10]}"


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, git.GitError) and not any(marker in exc.stderr for marker in _PERMANENT)


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
    def __init__(self, cache_dir: Path, url: str) -> None:
        try:  # checked where the URL enters too; here so no caller can skip it
            self.url = validate.repo_url(url)
        except ValueError as exc:
            raise UsageError(f"repository URL: {exc}") from exc
        self.shown_url = validate.redact_url(url)  # for messages: never show credentials
        self.path = cache_dir / "mirrors" / f"{_slug(url)}.git"

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive use while refs change; concurrent runs wait here."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            self._ensure()
            yield

    def _ensure(self) -> None:
        if (self.path / "HEAD").exists():
            return
        self._remove_abandoned_inits()
        tmp = self.path.with_name(self.path.name + f"{_INIT}{os.getpid()}")
        try:
            git.run(["init", "--bare", "--quiet", "--", str(tmp)])
            # Only for humans poking at the cache: fetches pass the URL, so no secret is stored.
            git.run(["config", "--", "remote.origin.url", self.shown_url], git_dir=tmp)
            git.run(["config", "gc.auto", "0"], git_dir=tmp)  # no gc racing a concurrent reader
            # Renamed into place last, so an interrupted init never leaves a half-made mirror.
            tmp.rename(self.path)
        except BaseException:  # Ctrl-C and SIGTERM too (the CLI turns it into an interrupt)
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _remove_abandoned_inits(self) -> None:
        """Half-made mirrors of processes that were killed outright (SIGKILL, a power cut);
        called under the mirror's lock, so no live process is still making one."""
        for leftover in self.path.parent.glob(f"{self.path.name}{_INIT}*"):
            pid = leftover.name.rpartition(_INIT)[2]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(leftover, ignore_errors=True)

    def _network(self, args: list[str], what: str) -> str:
        try:
            for attempt in _retrying():
                with attempt:
                    return git.text(args, git_dir=self.path)
        except RetryError as exc:
            last = exc.last_attempt.exception()
            detail = last.stderr if isinstance(last, git.GitError) else str(last)
            raise RemoteError(
                f"cannot {what} {self.shown_url}: {validate.redact_url(_first_line(detail))}",
                f"check the URL and your network, or point the engine elsewhere with "
                f"--repo ENGINE=URL (tried {exc.last_attempt.attempt_number} times)",
            ) from exc
        except git.GitError as exc:
            detail = validate.redact_url(exc.stderr)
            raise RemoteError(f"cannot {what} {self.shown_url}: {detail}") from exc
        raise AssertionError("unreachable")

    def ls_remote(self, patterns: list[str]) -> RemoteRefs:
        output = self._network(["ls-remote", "--", self.url, *patterns], "list refs of")
        refs: dict[str, str] = {}
        for line in output.splitlines():
            sha, _, name = line.partition("\t")
            refs[name] = sha
        return RemoteRefs(refs)

    def fetch(self, refspecs: list[str]) -> None:
        if not refspecs:
            return
        with console.status(f"fetching {len(refspecs)} ref(s) from {self.shown_url}"):
            self._network(
                [
                    "fetch",
                    "--quiet",
                    "--no-write-fetch-head",
                    "--tags",
                    "--force",
                    "--",
                    self.url,
                    *refspecs,
                ],
                "fetch from",
            )

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
