"""Does a registry manifest hold the image images.lock pins? For both Docker image stores.

With the classic store an image id is the config digest, and a pushed single-image manifest
names it as ``config.digest``. With the containerd image store (the default of newer Docker
installs) an image id is the digest of a manifest or of an OCI index, and what gets pushed is
often an index: one manifest per platform, plus attestation manifests (BuildKit adds them for
provenance and SBOMs; their platform is ``unknown/unknown``). So a manifest holds image ``ID``
for ``PLATFORM`` when ``ID`` is its digest, its config digest, or, for an index, the digest or
config digest of its ``PLATFORM`` manifest, never of an attestation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from sparkbuild.registry.address import Manifest
from sparkbuild.registry.client import RegistryClient

INDEX_TYPES = frozenset(
    {
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    }
)
_REFERENCE_TYPE = "vnd.docker.reference.type"


def _body(manifest: Manifest) -> dict[str, object]:
    try:
        data = json.loads(manifest.body)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def is_index(manifest: Manifest) -> bool:
    return manifest.media_type in INDEX_TYPES or "manifests" in _body(manifest)


def _object(descriptor: Mapping[str, object], key: str) -> dict[str, object]:
    """``descriptor[key]`` if it is a JSON object, else empty (an index is registry data)."""
    value = descriptor.get(key)
    return value if isinstance(value, dict) else {}


def _is_attestation(descriptor: Mapping[str, object]) -> bool:
    annotations = _object(descriptor, "annotations")
    platform = _object(descriptor, "platform")
    return annotations.get(_REFERENCE_TYPE) == "attestation-manifest" or (
        platform.get("os") == "unknown" and platform.get("architecture") == "unknown"
    )


def _matches_platform(descriptor: Mapping[str, object], platform: str) -> bool:
    os_name, _, rest = platform.partition("/")
    architecture, _, variant = rest.partition("/")
    offered = _object(descriptor, "platform")
    if offered.get("os") != os_name or offered.get("architecture") != architecture:
        return False
    return not variant or offered.get("variant") in (None, variant)


def platform_manifests(manifest: Manifest, platform: str) -> list[str]:
    """Digests of an index's image manifests for ``platform`` (attestations left out)."""
    return [
        str(child["digest"])
        for child in _list(_body(manifest).get("manifests"))
        if isinstance(child, dict)
        and isinstance(child.get("digest"), str)
        and not _is_attestation(child)
        and _matches_platform(child, platform)
    ]


def holds_image(
    client: RegistryClient, repository: str, manifest: Manifest, image_id: str, platform: str
) -> bool:
    """Whether ``manifest`` (in ``repository``) is, or contains for ``platform``, ``image_id``.

    An index's child is fetched even when its listed digest is the image id: the client
    refuses a child whose bytes do not hash to that digest, so what is accepted is what the
    registry really serves."""
    if image_id in (manifest.digest, manifest.config_digest):
        return True
    if not is_index(manifest):
        return False
    for digest in platform_manifests(manifest, platform):
        child = client.manifest(repository, digest, push=True)
        if child is not None and image_id in (child.digest, child.config_digest):
            return True
    return False


def describe(manifest: Manifest) -> str:
    """What a manifest holds, for messages: an image config or an index of N manifests."""
    if is_index(manifest):
        return f"an index of {len(_list(_body(manifest).get('manifests')))} manifest(s)"
    return f"image {(manifest.config_digest or 'unknown')[:19]}"


__all__ = ["describe", "holds_image", "is_index", "platform_manifests"]
