"""An image's names: the spec's tag templates rendered, applied, and its registry digest."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkbuild import imageref
from sparkbuild.errors import SpecError, UnknownPlaceholderError
from sparkbuild.spec import Build

if TYPE_CHECKING:
    from docker.models.images import Image


def render_tags(build: Build, tree: str) -> tuple[str, ...]:
    rendered = []
    for template in build.image.tags:
        try:
            tag = imageref.render(template, build, tree)
        except UnknownPlaceholderError as exc:
            raise SpecError(
                f"{build.spec_file}: builds.{build.name}.tags: '{template}' uses an unknown "
                f"placeholder ({exc})",
                imageref.placeholder_hint(),
            ) from None
        if not imageref.REFERENCE.match(tag):
            raise SpecError(
                f"{build.spec_file}: builds.{build.name}.tags: '{tag}' is not a valid image "
                "reference (lowercase repository, optional :tag)",
            )
        rendered.append(tag)
    return tuple(dict.fromkeys(rendered))


def ensure_tags(image: Image, tags: tuple[str, ...]) -> None:
    present = set(image.tags)
    for tag in tags:
        if tag not in present:
            repository, name = imageref.split_tag(tag)
            image.tag(repository, name)


def repo_digest(image: Image) -> str | None:
    digests = image.attrs.get("RepoDigests") or []
    return str(digests[0]) if digests else None
