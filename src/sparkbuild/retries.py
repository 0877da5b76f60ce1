"""How often, and for how long, a network operation is tried: one policy for git remotes and
registries, bounded whatever the environment asks.

``SPARKBUILD_NET_ATTEMPTS`` and ``SPARKBUILD_NET_BACKOFF`` tune it (tests set them low); a
value beyond :data:`MAX_ATTEMPTS` or :data:`MAX_BACKOFF_SCALE` is refused by name, since
``SPARKBUILD_NET_ATTEMPTS=1000000000`` would retry a dead server for days.

A host that cannot be reached at all (its name does not resolve, it refuses the connection,
no route leads to it) is not retried: offline, a retry only makes the failure slower. It is
remembered for the rest of the run (:func:`unreachable`), so the next build that names the
same host fails at once with the same cause instead of asking again.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from tenacity import Retrying, stop_after_attempt, stop_after_delay, wait_exponential
from tenacity.retry import retry_base

from sparkbuild.settings import env_number

MAX_ATTEMPTS = 20
MAX_BACKOFF_SCALE = 10.0
#: The longest all attempts of one operation may take together.
MAX_RETRY_SECONDS = 900.0
ATTEMPTS_ENV = "SPARKBUILD_NET_ATTEMPTS"
BACKOFF_ENV = "SPARKBUILD_NET_BACKOFF"


def attempts(default: int) -> int:
    """Tries of one network operation: ``SPARKBUILD_NET_ATTEMPTS``, 1 to :data:`MAX_ATTEMPTS`."""
    return max(int(env_number(ATTEMPTS_ENV, str(default), int, MAX_ATTEMPTS)), 1)


def retrying(retry: retry_base, default_attempts: int) -> Retrying:
    """tenacity's ``Retrying`` with the bounds: capped attempts, exponential backoff of at most
    30 s per wait (times the scale), and all of it within :data:`MAX_RETRY_SECONDS`."""
    scale = env_number(BACKOFF_ENV, "1", float, MAX_BACKOFF_SCALE)
    return Retrying(
        stop=stop_after_attempt(attempts(default_attempts)) | stop_after_delay(MAX_RETRY_SECONDS),
        wait=wait_exponential(multiplier=scale, min=0, max=30 * scale),
        retry=retry,
        reraise=False,
    )


# What the network stacks we use (git/curl, ssh, Go's resolver in dockerd, urllib3) say when a
# host cannot be reached at all, and the one name sparkbuild gives each cause.
_CAUSES = (
    (
        re.compile(
            r"could not resolve host|could not resolve hostname|name or service not known|"
            r"temporary failure in name resolution|no address associated with hostname|"
            r"nodename nor servname|failed to resolve|: no such host|server misbehaving|"
            r"name resolution",
            re.IGNORECASE,
        ),
        "does not resolve (no DNS answer for its name)",
    ),
    (re.compile(r"connection refused", re.IGNORECASE), "refused the connection"),
    # curl (git over http) since 7.8x: a refused connection and a missing route alike
    (
        re.compile(r"couldn't connect to server", re.IGNORECASE),
        "accepts no connection (refused, or no route to it)",
    ),
    (re.compile(r"network is unreachable", re.IGNORECASE), "is on no network this host reaches"),
    (re.compile(r"no route to host", re.IGNORECASE), "has no route to it"),
)

# Hosts found unreachable in this run: host -> the cause, as :func:`unreachable_cause` names it.
_UNREACHABLE: dict[str, str] = {}


def unreachable_cause(text: str) -> str | None:
    """Why a host cannot be reached at all, read from a tool's error text (git, ssh, dockerd,
    requests), or None when the text says something else (a timeout, an HTTP error)."""
    for pattern, cause in _CAUSES:
        if pattern.search(text):
            return cause
    return None


def host_of(url: str) -> str:
    """The host (and port) a URL or scp-like git address names; ``""`` for a local path."""
    if "://" in url:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        return f"{host}:{parts.port}" if host and parts.port else host
    scp = re.match(r"^(?:[^@/]+@)?([^:/]+):", url)  # user@host:path
    return scp.group(1).lower() if scp else ""


def remember_unreachable(url: str, cause: str) -> None:
    host = host_of(url)
    if host:
        _UNREACHABLE.setdefault(host, cause)


def unreachable(url: str) -> str | None:
    """The cause, when ``url``'s host was found unreachable earlier in this run."""
    return _UNREACHABLE.get(host_of(url))


def forget_unreachable() -> None:
    """A new run (a command) asks every host again."""
    _UNREACHABLE.clear()


__all__ = [
    "MAX_ATTEMPTS",
    "attempts",
    "forget_unreachable",
    "host_of",
    "remember_unreachable",
    "retrying",
    "unreachable",
    "unreachable_cause",
]
