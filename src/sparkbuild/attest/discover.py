"""Reading what is attached to an image: its signature manifest and its referrers, bounded
and checked, whatever the registry serves.

A referrers index comes from the API where the registry serves it, else from the fallback
tag. Either way it is registry data: it is read with a cap (:data:`layout.INDEX_LIMIT`),
refused when it is not an index or lists more than :data:`layout.MAX_ENTRIES` entries, and
filtered by artifact type; each referrer's own manifest must name the image as its subject.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkbuild.attest import layout
from sparkbuild.errors import ReferrersError, RegistryError, SignatureError
from sparkbuild.registry.client import RegistryClient, get_blob


@dataclass(frozen=True)
class Referrer:
    digest: str
    manifest: layout.ImageManifest


def _read(
    client: RegistryClient,
    repository: str,
    tag: str,
    what: str,
    error: type[RegistryError] | type[ReferrersError] | type[SignatureError],
) -> bytes | None:
    try:
        found = client.manifest(repository, tag, max_body=layout.INDEX_LIMIT)
    except RegistryError as exc:
        raise error(
            f"{client.registry.host}/{repository}:{tag}: {what} cannot be read: {exc.message}",
            "the registry holds a damaged or oversized index; remove the tag and publish again",
        ) from None
    return found.body if found else None


def fallback_index(client: RegistryClient, repository: str, digest: str) -> layout.Index | None:
    """The referrers tag schema's index for ``digest``; None when there is none (or the tag
    serves something else, as GHCR serves the image itself for a missing tag)."""
    tag = layout.fallback_tag(digest)
    body = _read(client, repository, tag, "the referrers index", ReferrersError)
    if body is None:
        return None
    return _index(body, f"{client.registry.host}/{repository}:{tag}", allow_other=True)


def _index(body: bytes, where: str, *, allow_other: bool) -> layout.Index | None:
    try:
        index = layout.parse_index(body)
    except ValueError as exc:
        if allow_other and b'"manifests"' not in body:
            return None  # an image manifest served for a missing tag, not an index
        raise ReferrersError(
            f"{where}: the referrers index is malformed ({layout.problem(exc)})",
            f"remove it (it lists at most {layout.MAX_ENTRIES} referrers) and publish again",
        ) from None
    if index.media_type not in (None, layout.OCI_INDEX):
        return None if allow_other else index
    return index


def referrer_descriptors(
    client: RegistryClient, repository: str, digest: str, artifact_type: str
) -> tuple[list[layout.Descriptor], bool]:
    """The index entries of ``artifact_type`` that refer to ``digest``, and whether they came
    from the referrers API (else the fallback tag)."""
    where = f"{client.registry.host}/{repository}"
    try:
        answered = client.referrers(repository, digest, artifact_type)
    except RegistryError as exc:
        raise ReferrersError(f"{where}: the referrers API failed: {exc.message}") from None
    if answered is not None:
        if len(answered) > layout.INDEX_LIMIT:
            raise ReferrersError(f"{where}: the referrers API's index is too large")
        index = _index(answered, f"{where} (referrers API)", allow_other=False)
        from_api = True
    else:
        index = fallback_index(client, repository, digest)
        from_api = False
    entries = index.manifests if index else []
    return [e for e in entries if e.artifact_type == artifact_type], from_api


def referrer(
    client: RegistryClient, repository: str, digest: str, descriptor: layout.Descriptor
) -> Referrer:
    """The referrer manifest an index entry names, which must refer to ``digest``."""
    where = f"{client.registry.host}/{repository}@{descriptor.digest}"
    try:
        found = client.manifest(repository, descriptor.digest, max_body=layout.INDEX_LIMIT)
    except RegistryError as exc:
        raise ReferrersError(f"{where}: cannot read the referrer: {exc.message}") from None
    if found is None:
        raise ReferrersError(f"{where}: listed as a referrer of {digest}, but it is not there")
    try:
        manifest = layout.parse_manifest(found.body)
    except ValueError as exc:
        raise ReferrersError(f"{where}: not a referrer manifest ({layout.problem(exc)})") from None
    subject = manifest.subject.digest if manifest.subject else None
    if subject != digest:
        raise ReferrersError(
            f"{where}: listed as a referrer of {digest}, but it refers to "
            f"{subject or 'no image'}; nothing from it is trusted",
            "someone wrote another image's attestation into this image's index; publish again "
            "to rewrite the index, and find out who can push to this repository",
        )
    return Referrer(descriptor.digest, manifest)


def signature_manifest(
    client: RegistryClient, repository: str, digest: str
) -> tuple[str, layout.ImageManifest] | None:
    """The ``sha256-<hex>.sig`` manifest (its digest and layers), or None when unsigned."""
    tag = layout.signature_tag(digest)
    try:
        found = client.manifest(repository, tag, max_body=layout.INDEX_LIMIT)
    except RegistryError as exc:
        raise SignatureError(
            f"{client.registry.host}/{repository}:{tag}: the signature cannot be read: "
            f"{exc.message}"
        ) from None
    if found is None:
        return None
    try:
        return found.digest, layout.parse_manifest(found.body)
    except ValueError as exc:
        raise SignatureError(
            f"{client.registry.host}/{repository}:{tag}: not a signature manifest "
            f"({layout.problem(exc)})",
            "remove the tag and publish (sign) again",
        ) from None


def legacy_attestations(
    client: RegistryClient, repository: str, digest: str
) -> layout.ImageManifest | None:
    """cosign's ``sha256-<hex>.att`` manifest, or None."""
    tag = layout.attestation_tag(digest)
    body = _read(client, repository, tag, "cosign's attestation manifest", ReferrersError)
    if body is None:
        return None
    try:
        return layout.parse_manifest(body)
    except ValueError as exc:
        raise ReferrersError(
            f"{client.registry.host}/{repository}:{tag}: malformed ({layout.problem(exc)})"
        ) from None


def blob(
    client: RegistryClient, repository: str, descriptor: layout.Descriptor, limit: int
) -> bytes:
    """A small blob an attachment names, bounded by ``limit`` and by its declared size."""
    if descriptor.size > limit:
        raise ReferrersError(
            f"{client.registry.host}/{repository}@{descriptor.digest}: {descriptor.size} bytes, "
            f"more than an attachment may have ({limit})"
        )
    try:
        return get_blob(client, repository, descriptor.digest, limit=limit)
    except RegistryError as exc:
        raise ReferrersError(f"cannot read an attachment: {exc.message}") from None
