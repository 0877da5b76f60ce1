"""Where things live for one run: project files, cache, lock, repository overrides."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from sparkbuild import validate
from sparkbuild.adapters.known import engine_names
from sparkbuild.errors import UsageError
from sparkbuild.redact import redact

LOCK_FILENAME = "images.lock"
# The longest wait a file may ask for (a boot, a request, pods getting ready): a week. Beyond
# it Python's and kubectl's own timeouts overflow (1e300 s crashed a run).
MAX_WAIT_S = 7 * 24 * 3600


def default_cache_dir() -> Path:
    env = os.environ.get("SPARKBUILD_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "sparkbuild"


@dataclass(frozen=True)
class Settings:
    project_dir: Path = field(default_factory=Path.cwd)
    cache_dir: Path = field(default_factory=default_cache_dir)
    lock_path: Path | None = None
    repo_overrides: dict[str, str] = field(default_factory=dict)
    quiet: bool = False

    @property
    def builds_dir(self) -> Path:
        return self.project_dir / "builds"

    @property
    def smoke_dir(self) -> Path:
        return self.project_dir / "smoke"

    @property
    def lock_file(self) -> Path:
        return self.lock_path if self.lock_path is not None else self.project_dir / LOCK_FILENAME


def parse_repo_overrides(values: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``--repo ENGINE=URL`` pairs into a dict, rejecting malformed ones by name."""
    overrides: dict[str, str] = {}
    engines = engine_names()  # the spec's `engine:` values
    for value in values:
        engine, sep, url = value.partition("=")
        if not sep or not engine or not url:
            raise UsageError(
                f"--repo {redact(value)!r} is not ENGINE=URL",
                f"for example: --repo {engines[0]}=/srv/mirrors/{engines[0]}.git",
            )
        engine, url = engine.strip(), url.strip()
        if engine not in engines:
            raise UsageError(
                f"--repo {redact(value)!r}: unknown engine {engine!r}",
                f"use one of: {', '.join(engines)}",
            )
        try:
            overrides[engine] = validate.repo_url(url)
        except ValueError as exc:
            raise UsageError(
                f"--repo {engine}=...: {exc}",
                "pass a https://, http://, ssh://, git://, file:// URL or a local path",
            ) from exc
    return overrides


def env_number(
    name: str, default: str, kind: type[int] | type[float], maximum: float | None = None
) -> float:
    """A numeric setting from the environment; a bad one (not a number, negative, more than
    ``maximum``) is a usage error naming it."""
    raw = os.environ.get(name, default)
    try:
        value = kind(raw)
        validate.finite(float(value), name)
    except ValueError as exc:
        raise UsageError(
            f"{name}={raw!r} is not a {'whole' if kind is int else 'finite'} number",
            f"unset it or set it to a number, e.g. {name}={default}",
        ) from exc
    if value < 0:
        raise UsageError(f"{name}={raw!r} must not be negative", f"e.g. {name}={default}")
    if maximum is not None and value > maximum:
        raise UsageError(f"{name}={raw!r} is more than {maximum:g}", f"e.g. {name}={default}")
    return value


def env_seconds(name: str, default: float, maximum: float = 3600.0) -> float:
    """A positive number of seconds from the environment, at most ``maximum``."""
    value = float(env_number(name, str(default), float, maximum))
    if value <= 0:
        raise UsageError(
            f"{name}={value:g} must be more than 0 seconds", f"e.g. {name}={default:g}"
        )
    return value
