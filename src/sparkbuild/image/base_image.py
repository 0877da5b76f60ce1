"""Pinning the base image: a reference resolved to the digest its registry serves now.

The daemon's distribution endpoint (docker SDK ``images.get_registry_data``) answers for
any registry the daemon can reach, with the credentials of ``docker login`` and the
daemon's insecure-registry rules, so no separate registry client is needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import docker.errors

from sparkbuild import retries
from sparkbuild.errors import BaseImageError, PlatformError, RegistryUnreachableError
from sparkbuild.imageref import DOCKER_HUB, digest_of, split_reference, strip_digest

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
    registry = _registry_url(reference)
    earlier = retries.unreachable(registry)
    if earlier is not None:
        raise _unreachable(reference, registry, earlier, where, again=True)
    try:
        data = api.images.get_registry_data(reference)
    except (docker.errors.NotFound, docker.errors.APIError) as exc:
        cause = retries.unreachable_cause(_explain(exc))
        if cause is not None:  # the daemon never reached the registry: not a wrong image
            registry = _asked(_explain(exc)) or registry
            retries.remember_unreachable(registry, cause)
            raise _unreachable(reference, registry, cause, where, again=False) from exc
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


def _registry_url(reference: str) -> str:
    host, _ = split_reference(reference)
    return f"https://{'registry-1.docker.io' if host == DOCKER_HUB else host}/v2/"


def _asked(explanation: str) -> str | None:
    """The URL the daemon asked (``Get "https://registry-1.docker.io/v2/": dial tcp: ...``)."""
    match = re.search(r'"(https?://[^"\s]+)"', explanation)
    return match.group(1) if match else None


def _unreachable(
    reference: str, registry: str, cause: str, where: str, *, again: bool
) -> RegistryUnreachableError:
    host = retries.host_of(registry)
    when = "found earlier in this run; not asked again" if again else "not retried"
    return RegistryUnreachableError(
        f"cannot reach the registry of base image {reference}: {host} {cause} ({when})",
        "the image may well exist: check this host's network and DNS (the Docker daemon asks "
        f"the registry); a base image in a registry you can reach goes in {where}",
        url=registry,
        cause=f"{host} {cause}",
    )


def _explain(exc: Exception) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc).strip()
