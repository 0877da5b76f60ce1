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

from sparkbuild.redact import redact

ALLOWED_SCHEMES = ("https", "http", "ssh", "git", "file")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)\Z", re.S)
# git's "<transport>::<address>" runs a remote helper; ext:: runs any command.
_TRANSPORT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9+.-]*::")
# scp-like ssh: [user@]host:path (git reads "host:path" so when no slash precedes the colon).
_SCP = re.compile(r"^(?:[A-Za-z0-9._~%+-]+@)?([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):(?!/?/)(.+)\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_BUILD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_REF = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/+-]*\Z")
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
        raise ValueError(f"{redact(url)!r} starts with '-' and would be read as a git option")
    if _TRANSPORT.match(url):
        raise ValueError(
            f"{redact(url)!r} uses a '<transport>::' remote helper, which can run commands; "
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
            raise ValueError(f"{redact(url)!r} is not a valid {name}:// URL")
        return url
    scp = _SCP.match(url)
    if scp and scp.group(1).startswith("-"):  # ssh would read the host as an option
        raise ValueError(f"{redact(url)!r}: an ssh host must not start with '-'")
    # Otherwise scp-like ssh or a local path: neither can be read as an option any more.
    return url


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


def tree_path(path: str) -> str:
    """A file's path inside the upstream tree (``sgl-kernel/CMakeLists.txt``): relative, no
    ``..``, nothing git could read as an option or a revision (``-x``, ``a:b``)."""
    parts = path.split("/") if isinstance(path, str) else []
    bad = (
        not parts
        or _CONTROL.search(path)
        or path.startswith(("-", "/"))
        or any(part in ("", ".", "..") for part in parts)
        or any(c in path for c in ":\\*?[")
    )
    if bad:
        raise ValueError(
            f"{path!r} is not a plain path inside the repository (such as "
            "'sgl-kernel/CMakeLists.txt': relative, no '..', no ':', '*', '?' or '[')"
        )
    return path


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.+-]*\Z")


def identifier(name: str) -> str:
    """A CMake target, variable or file name the source steps look for."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ValueError(f"{name!r} is not a plain CMake name (letters, digits, '_', '.', '-')")
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
    """A folder of the upstream tree (``python/sglang``, a trailing ``/`` allowed): relative, no
    ``..``, no control character, nothing git could read as an option, since it becomes a path
    in the checkout and in the image."""
    tree_path(value.rstrip("/") if value != "/" else value)
    return value


def finite(value: float, what: str = "value") -> float:
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, not {value}")
    return value
