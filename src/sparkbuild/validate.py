"""Checks for everything that enters from outside: repository URLs, git refs, build names,
project paths and numbers. Each returns the value or raises ``ValueError`` with the reason,
so pydantic validators and the command line can share them.

Why so strict: a URL or a ref handed to git can become an option (``--upload-pack=CMD``) or a
command transport (``ext::sh -c CMD``) and run a command; a name or a path can leave the
project or the cache.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

ALLOWED_SCHEMES = ("https", "http", "ssh", "git", "file")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.S)
# git's "<transport>::<address>" runs a remote helper; ext:: runs any command.
_TRANSPORT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9+.-]*::")
# scp-like ssh: [user@]host:path (git reads "host:path" so when no slash precedes the colon).
_SCP = re.compile(r"^(?:[A-Za-z0-9._~%+-]+@)?([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):(?!/?/)(.+)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/\s@]+)@")
_BUILD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_REF = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/+-]*$")
MAX_BUILD_NAME = 128


def repo_url(url: str) -> str:
    """``url`` if git may fetch from it without running anything else; else ValueError."""
    if not isinstance(url, str) or not url:
        raise ValueError("a repository URL must not be empty")
    if url != url.strip() or _CONTROL.search(url):
        raise ValueError(
            "a repository URL must not start or end with spaces or hold control characters"
        )
    if url.startswith("-"):
        raise ValueError(f"{redact_url(url)!r} starts with '-' and would be read as a git option")
    if _TRANSPORT.match(url):
        raise ValueError(
            f"{redact_url(url)!r} uses a '<transport>::' remote helper, which can run commands; "
            f"use one of {', '.join(ALLOWED_SCHEMES)} or a local path"
        )
    scheme = _SCHEME.match(url)
    if scheme:
        name, rest = scheme.group(1).lower(), scheme.group(2)
        if name not in ALLOWED_SCHEMES:
            raise ValueError(
                f"scheme '{name}://' is not allowed; use one of "
                f"{', '.join(s + '://' for s in ALLOWED_SCHEMES)} or a local path"
            )
        host = rest.split("/", 1)[0].rpartition("@")[2]
        if host.startswith("-") or any(c.isspace() for c in rest):
            raise ValueError(f"{redact_url(url)!r} is not a valid {name}:// URL")
        return url
    scp = _SCP.match(url)
    if scp and scp.group(1).startswith("-"):  # ssh would read the host as an option
        raise ValueError(f"{redact_url(url)!r}: an ssh host must not start with '-'")
    # Otherwise scp-like ssh or a local path: neither can be read as an option any more.
    return url


def _is_ssh_user(match: re.Match[str]) -> bool:
    """``ssh://git@host``: a login name, not a secret (a token needs ``user:token@``)."""
    return match.group(1).lower() == "ssh://" and ":" not in match.group(2)


def redact_url(text: str) -> str:
    """Text with the userinfo of every URL in it (``user:token@``) replaced by ``***@``."""
    return _USERINFO.sub(lambda m: m.group(0) if _is_ssh_user(m) else m.group(1) + "***@", text)


def strip_userinfo(url: str) -> str:
    """The URL without ``user:token@``: what may be stored (lock, image labels)."""
    return _USERINFO.sub(lambda m: m.group(0) if _is_ssh_user(m) else m.group(1), url)


def git_ref(ref: str) -> str:
    """A branch, tag or commit name that cannot become a git option or change a refspec."""
    bad = (
        not _REF.match(ref)
        or ".." in ref
        or "//" in ref
        or "/." in ref
        or ref.endswith((".", "/", ".lock"))
    )
    if bad:
        raise ValueError(
            f"{ref!r} is not a usable git ref name (letters, digits and ._/+- only, starting "
            "with a letter or digit, no '..')"
        )
    return ref


def build_name(name: str) -> str:
    if not isinstance(name, str) or not _BUILD_NAME.match(name):
        raise ValueError(
            f"{name!r} is not a valid build name: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    if len(name) > MAX_BUILD_NAME:  # it names files, directories, tags and containers
        raise ValueError(
            f"the build name {name[:40]}... is {len(name)} characters long; use at most "
            f"{MAX_BUILD_NAME}"
        )
    return name


def inside(root: Path, relative: str, what: str = "path") -> Path:
    """``root / relative`` resolved, if it stays inside ``root`` (symlinks followed)."""
    if not relative or _CONTROL.search(relative):
        raise ValueError(f"{what} {relative!r} is empty or holds control characters")
    base = root.resolve()
    try:
        path = (base / relative).resolve()
    except (RuntimeError, OSError) as exc:  # Python 3.11 raises RuntimeError for a loop
        raise ValueError(f"{what} {relative!r} cannot be resolved: {exc}") from None
    if Path(relative).is_absolute() or not path.is_relative_to(base):
        raise ValueError(f"{what} {relative!r} is outside the project ({base})")
    return path


def package_dir(value: str) -> str:
    """A directory inside the engine's checkout (``package_dir:``): relative, no ``..``, no
    control characters, since it becomes a path in the checkout and in the image."""
    parts = value.strip("/").split("/")
    if _CONTROL.search(value) or not value.strip("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(
            f"{value!r} is not a directory inside the checkout; write a relative path such as "
            "'python/sglang', without '..' or control characters"
        )
    return value


def finite(value: float, what: str = "value") -> float:
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, not {value}")
    return value
