"""The base image's config (its USER), read from its registry without pulling a layer.

An overlay applies its files as root and then restores the base's own USER, so the image
runs as the same user as the upstream release. Dockerfiles cannot read a base's USER, so
sparkbuild asks the registry: the manifest by the pinned digest (an index is narrowed to the
build's platform), then the small config blob. Credentials come from `docker login` only
(the publish variables belong to the publish registry).
"""

from __future__ import annotations

import json
from typing import Any

from sparkbuild.errors import BaseImageError
from sparkbuild.image.base_image import BaseImage
from sparkbuild.imageref import split_reference
from sparkbuild.registry import credentials as creds
from sparkbuild.registry.address import Registry
from sparkbuild.registry.client import RegistryClient, get_blob

_INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)


def _json(body: bytes, what: str) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise BaseImageError(f"{what} is not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise BaseImageError(f"{what} is not a JSON object")
    return data


def _platform_manifest(index: dict[str, Any], platform: str, what: str) -> str:
    os_name, _, arch = platform.partition("/")
    for entry in index.get("manifests") or []:
        wanted = entry.get("platform") or {}
        if (
            wanted.get("os") == os_name
            and wanted.get("architecture") == arch
            and entry.get("digest")
        ):
            return str(entry["digest"])
    raise BaseImageError(f"{what} has no {platform} manifest")


def image_config(base: BaseImage, platform: str) -> dict[str, object]:
    """The ``config`` section (User, Env, ...) of ``base`` for ``platform``."""
    section = full_config(base, platform).get("config") or {}
    return section if isinstance(section, dict) else {}


def full_config(base: BaseImage, platform: str) -> dict[str, object]:
    """The whole image config of ``base`` for ``platform`` (rootfs, history, config)."""
    host, repository = split_reference(base.reference)
    stored = creds.from_docker_config(host) or creds.Credentials("nowhere (anonymous)")
    client = RegistryClient(Registry.parse(host), stored)
    what = f"base image {base.pinned}"
    manifest = client.manifest(repository, base.digest)
    if manifest is None:
        raise BaseImageError(
            f"{what}: its registry no longer serves the pinned digest",
            "re-pin it: build without --locked",
        )
    body = _json(manifest.body, f"{what}: manifest")
    if manifest.media_type in _INDEX_TYPES or "manifests" in body:
        digest = _platform_manifest(body, platform, what)
        single = client.manifest(repository, digest)
        if single is None:
            raise BaseImageError(f"{what}: its {platform} manifest {digest} is missing")
        body = _json(single.body, f"{what}: {platform} manifest")
    config_digest = (body.get("config") or {}).get("digest")
    if not config_digest:
        raise BaseImageError(f"{what}: its manifest names no config")
    return _json(get_blob(client, repository, str(config_digest)), f"{what}: config")


def base_user(base: BaseImage, platform: str) -> str:
    """The base's USER (``""`` when it runs as root by default)."""
    return str(image_config(base, platform).get("User") or "")
