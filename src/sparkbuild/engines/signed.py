"""Before an engine runs an image (``smoke``/``bench`` ``--image``, ``--cluster``) with
``--key PUB``: every node's copy of the image must be one the key signed.

A node's image is known by its id; the registry digests it was pulled by (``RepoDigests``)
are where a signature can be found. One of them must carry a signature by the key, and its
manifest must hold that very id (an index: its manifest for the node's platform). An image
built locally, or loaded without a registry, has no digest to check and is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import docker.errors

from sparkbuild import imageref
from sparkbuild.attest.keys import PublicKey
from sparkbuild.attest.verify import check_signature
from sparkbuild.errors import SignatureError, SparkbuildError
from sparkbuild.registry import credentials, manifests
from sparkbuild.registry.address import Registry
from sparkbuild.registry.client import RegistryClient

if TYPE_CHECKING:
    from docker import DockerClient


def _signed_digest(reference: str, image_id: str, platform: str, public: PublicKey) -> str:
    """Why ``reference`` (HOST/REPO@DIGEST) does not prove ``image_id``, or "" if it does."""
    host, repository = imageref.split_reference(reference)
    digest = imageref.digest_of(reference) or ""
    client = RegistryClient(Registry.parse(host), credentials.resolve(host))
    try:
        finding = check_signature(client, repository, digest, public)
        if not finding.ok:
            return finding.detail
        manifest = client.manifest(repository, digest)
    except SparkbuildError as exc:
        return exc.message
    if manifest is None or not manifests.holds_image(
        client, repository, manifest, image_id, platform
    ):
        return f"{reference} does not hold image {image_id[:19]}"
    return ""


def require_signed(
    image: str,
    nodes: Sequence[tuple[str, DockerClient]],
    public: PublicKey,
) -> None:
    """Refuse, naming the node, unless each node's ``image`` is signed by ``public``. A node
    that does not hold the image yet receives this host's (checked) copy."""
    checked: set[str] = set()
    for name, client in nodes:
        try:
            found = client.images.get(image)
        except docker.errors.ImageNotFound:
            continue
        image_id = str(found.id)
        platform = f"{found.attrs.get('Os') or 'linux'}/{found.attrs.get('Architecture') or ''}"
        if image_id in checked:
            continue
        digests = [str(d) for d in found.attrs.get("RepoDigests") or []]
        reasons = [why for d in digests if (why := _signed_digest(d, image_id, platform, public))]
        if len(reasons) == len(digests):
            seen = "; ".join(reasons) or "it has no registry digest (built or loaded locally)"
            raise SignatureError(
                f"node {name}: {image} ({image_id[:19]}) is not signed by "
                f"{public.fingerprint[:19]}: {seen}",
                "pull the published image by digest on that node (`docker pull REF@DIGEST`), "
                "or run without --key",
            )
        checked.add(image_id)
    if not checked:
        raise SignatureError(f"no node holds {image}; nothing to check against --key")


__all__ = ["require_signed"]
