"""Where a build is published: registry, repository path, an immutable tag, moving aliases."""

from __future__ import annotations

from dataclasses import dataclass

from sparkbuild import imageref
from sparkbuild.errors import UnknownPlaceholderError, UsageError
from sparkbuild.registry.address import Registry
from sparkbuild.spec import Build

DEFAULT_REPOSITORY = "sparkbuild/{engine}"
DEFAULT_ALIASES = ("{version}-sm121",)
IMMUTABLE_TAG = "{version}-sm121-{tree_short}"


@dataclass(frozen=True)
class Destination:
    """One build's destination: ``registry`` + repository path, immutable tag, aliases."""

    registry: Registry
    repository: str
    tag: str
    aliases: tuple[str, ...]

    @property
    def reference(self) -> str:
        return self.registry.reference(self.repository)


def render_repository(template: str, build: Build) -> str:
    """``--repository`` before the tree is known (rollback): no ``{tree_short}``."""
    return _render(template, build, None, "--repository")


def _render(template: str, build: Build, tree: str | None, what: str) -> str:
    try:
        return imageref.render(template, build, tree)
    except UnknownPlaceholderError as exc:
        raise UsageError(
            f"{what} '{template}' uses an unknown placeholder ({exc})", imageref.placeholder_hint()
        ) from None


def plan_destination(
    build: Build,
    tree: str,
    registry: Registry,
    *,
    repository: str = DEFAULT_REPOSITORY,
    aliases: tuple[str, ...] = DEFAULT_ALIASES,
) -> Destination:
    tag = _render(IMMUTABLE_TAG, build, tree, "tag")
    rendered = tuple(dict.fromkeys(_render(a, build, tree, "--alias") for a in aliases))
    for name in (tag, *rendered):
        if not imageref.TAG.match(name):
            raise UsageError(f"'{name}' is not a valid tag (letters, digits, '_', '.', '-')")
    if tag in rendered:
        raise UsageError(f"--alias {tag} is the immutable tag; aliases must differ from it")
    path = registry.repository(_render(repository, build, tree, "--repository"))
    return Destination(registry, path, tag, rendered)
