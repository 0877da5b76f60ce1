"""Pinning the base image: a reference resolved to the digest its registry serves now.

The daemon's distribution endpoint (docker SDK ``images.get_registry_data``) answers for
any registry the daemon can reach, with the credentials of ``docker login`` and the
daemon's insecure-registry rules, so no separate registry client is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import docker.errors

from sparkbuild.errors import BaseImageError, PlatformError
from sparkbuild.imageref import digest_of, strip_digest

if TYPE_CHECKING:
    from docker import DockerClient


@dataclass(frozen=True)
class BaseImage:
    reference: str  # as the spec names it, e.g. lmsysorg/sglang:v0.5.12-cu130
    digest: str  # sha256:... (a manifest list or a single manifest)

    @property
    def pinned(self) -> str:
        """``name:tag@digest``: BuildKit fetches exactly the digest; the tag stays readable."""
        return f"{strip_digest(self.reference)}@{self.digest}"


def resolve(api: DockerClient, reference: str, platform: str, *, where: str) -> BaseImage:
    """Ask the registry for ``reference``'s digest and check it offers ``platform``.

    ``where`` names the spec field for error messages.
    """
    try:
        data = api.images.get_registry_data(reference)
    except (docker.errors.NotFound, docker.errors.APIError) as exc:
        raise BaseImageError(
            f"base image {reference} not found in its registry ({_explain(exc)})",
            f"check {where}; BuildKit fetches FROM through a registry, so an image that is only "
            "in the local store must be pushed to a registry first (`docker push`)",
        ) from exc
    if not data.has_platform(platform):  # type: ignore[no-untyped-call]  # untyped in the stubs
        offered = ", ".join(
            f"{p.get('os')}/{p.get('architecture')}" for p in data.attrs.get("Platforms", [])
        )
        raise PlatformError(
            f"base image {reference} has no {platform} variant (it offers: {offered or '?'})",
            f"pick a {platform} image in {where}, or pass --platform",
        )
    digest = digest_of(reference) or str(data.id)
    return BaseImage(reference=strip_digest(reference), digest=digest)


def pinned(reference: str, digest: str) -> BaseImage:
    """The base a lock pins, used as is (the registry is asked nothing)."""
    return BaseImage(reference=strip_digest(reference), digest=digest)


def _explain(exc: Exception) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc).strip()
