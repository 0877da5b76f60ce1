"""Signing an image and attaching its attestations, in the layouts of :mod:`layout`.

Order matters: everything already attached is read (and refused if damaged) before anything
is written; the attestations go up first, the signature last. A run that fails before the
end leaves the image unsigned, and the caller records nothing.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sparkbuild import __version__, console
from sparkbuild.attest import discover, layout, signing
from sparkbuild.attest.keys import PublicKey
from sparkbuild.attest.signing import Signer
from sparkbuild.errors import ReferrersError
from sparkbuild.registry.address import Manifest
from sparkbuild.registry.client import RegistryClient


@dataclass(frozen=True)
class Attached:
    signature: str  # the digest of the signature manifest (sha256-<hex>.sig)
    attestations: dict[str, str]  # predicate type -> the referrer manifest's digest
    referrers_api: bool  # the registry indexed them itself (else: the fallback tag)
    identity: str  # the key's fingerprint (or "keyless")
    legacy: str | None = None  # cosign's sha256-<hex>.att manifest
    signed_now: bool = True  # False: an existing signature by this key was kept
    payloads: dict[str, int] = field(default_factory=dict)  # predicate type -> envelope bytes


@dataclass(frozen=True)
class _Existing:
    index: layout.Index | None
    signature: layout.ImageManifest | None
    legacy: layout.ImageManifest | None


def _existing(client: RegistryClient, repository: str, digest: str) -> _Existing:
    """What is attached already; a damaged or oversized attachment stops here, before any
    write."""
    signature = discover.signature_manifest(client, repository, digest)
    index = discover.fallback_index(client, repository, digest)
    for entry in index.manifests if index else []:
        if entry.artifact_type == layout.ATTESTATION_ARTIFACT:
            discover.referrer(client, repository, digest, entry)  # refers to this image
    return _Existing(
        index,
        signature[1] if signature else None,
        discover.legacy_attestations(client, repository, digest),
    )


def _put_manifest(
    client: RegistryClient, repository: str, manifest: layout.ImageManifest, tag: str | None = None
) -> tuple[str, bytes, str | None]:
    body = layout.to_bytes(manifest)
    from sparkbuild.registry.address import sha256_digest

    digest = sha256_digest(body)
    put = client.put_manifest_bytes(repository, tag or digest, layout.OCI_MANIFEST, body)
    return put.digest, body, put.subject


def _attest_one(
    client: RegistryClient,
    repository: str,
    subject: layout.Descriptor,
    predicate_type: str,
    statement: bytes,
    signer: Signer,
    created: str,
) -> tuple[layout.Descriptor, str, bytes, layout.ImageManifest, str | None]:
    envelope = json.dumps(signing.envelope(statement, signer), separators=(",", ":")).encode()
    layer = layout.Descriptor(
        media_type=layout.DSSE_ENVELOPE,
        digest=client.put_blob(repository, envelope),
        size=len(envelope),
        annotations={
            layout.PREDICATE_ANNOTATION: predicate_type,
            layout.COSIGN_PREDICATE_ANNOTATION: predicate_type,
        },
    )
    manifest = layout.attestation_manifest(subject, layer, predicate_type, created)
    digest, body, indexed = _put_manifest(client, repository, manifest)
    return layer, digest, body, manifest, indexed


def _superseded(entry: layout.Descriptor, types: set[str]) -> bool:
    annotations = entry.annotations or {}
    return entry.artifact_type == layout.ATTESTATION_ARTIFACT and (
        annotations.get(layout.PREDICATE_ANNOTATION) in types
    )


def _write_fallback(
    client: RegistryClient,
    repository: str,
    digest: str,
    existing: layout.Index | None,
    entries: list[layout.Descriptor],
    types: set[str],
) -> None:
    kept = [e for e in (existing.manifests if existing else []) if not _superseded(e, types)]
    manifests = [*kept, *entries]
    if len(manifests) > layout.MAX_ENTRIES:
        raise ReferrersError(f"{repository}: more than {layout.MAX_ENTRIES} referrers of {digest}")
    index = layout.Index(schema_version=2, media_type=layout.OCI_INDEX, manifests=manifests)
    client.put_manifest_bytes(
        repository, layout.fallback_tag(digest), layout.OCI_INDEX, layout.to_bytes(index)
    )


def _cosign_manifest(
    client: RegistryClient, repository: str, layers: list[layout.Descriptor]
) -> layout.ImageManifest:
    config = layout.cosign_config([layer.digest for layer in layers])
    descriptor = layout.Descriptor(
        media_type=layout.OCI_CONFIG, digest=client.put_blob(repository, config), size=len(config)
    )
    return layout.cosign_manifest(layers, descriptor)


def _write_legacy(
    client: RegistryClient,
    repository: str,
    digest: str,
    existing: layout.ImageManifest | None,
    layers: list[layout.Descriptor],
    types: set[str],
) -> str:
    kept = [
        layer
        for layer in (existing.layers if existing else [])
        if (layer.annotations or {}).get(layout.COSIGN_PREDICATE_ANNOTATION) not in types
    ]
    manifest = _cosign_manifest(client, repository, [*kept, *layers][-layout.MAX_ENTRIES :])
    return _put_manifest(client, repository, manifest, layout.attestation_tag(digest))[0]


def signed_by(
    client: RegistryClient,
    repository: str,
    manifest_digest: str,
    signature: layout.ImageManifest | None,
    public: PublicKey,
) -> bool:
    """Whether ``signature`` already holds a valid signature of ``manifest_digest`` by
    ``public`` (re-publishing then adds none)."""
    from sparkbuild.attest.verify import signature_findings

    if signature is None:
        return False
    return signature_findings(client, repository, manifest_digest, signature, public)[0]


def _sign(
    client: RegistryClient,
    repository: str,
    reference: str,
    manifest_digest: str,
    existing: layout.ImageManifest | None,
    signer: Signer,
) -> str:
    payload = layout.simple_signing_payload(
        reference, manifest_digest, f"sparkbuild {__version__}", int(time.time())
    )
    signature = signer.sign(payload)
    layer = layout.signature_layer(
        client.put_blob(repository, payload),
        len(payload),
        signature,
        signer.annotations(payload, signature),
    )
    layers = [*(existing.layers if existing else []), layer][-layout.MAX_ENTRIES :]
    manifest = _cosign_manifest(client, repository, layers)
    return _put_manifest(client, repository, manifest, layout.signature_tag(manifest_digest))[0]


def sign_and_attach(
    client: RegistryClient,
    repository: str,
    manifest: Manifest,
    statements: dict[str, bytes],
    signer: Signer,
    public: PublicKey | None = None,
) -> Attached:
    """Attach ``statements`` (predicate type -> in-toto Statement bytes) to ``manifest`` in
    ``repository`` as signed DSSE referrers, then sign the manifest's digest. ``public``: the
    signer's key, to keep an existing signature by it instead of adding another."""
    reference = client.registry.reference(repository)
    existing = _existing(client, repository, manifest.digest)
    subject = layout.subject_of(manifest)
    created = datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    client.put_blob(repository, layout.EMPTY_JSON)
    layers, entries, attested, indexed_by_api = [], [], {}, True
    sizes = {}
    with console.status(f"attaching {len(statements)} attestation(s) to {reference}"):
        for predicate_type, statement in statements.items():
            layer, digest, body, made, indexed = _attest_one(
                client, repository, subject, predicate_type, statement, signer, created
            )
            layers.append(layer)
            entries.append(layout.referrer_descriptor(digest, body, made))
            attested[predicate_type] = digest
            sizes[predicate_type] = layer.size
            indexed_by_api = indexed_by_api and indexed == manifest.digest
    types = set(statements)
    if not indexed_by_api:
        _write_fallback(client, repository, manifest.digest, existing.index, entries, types)
    legacy = _write_legacy(client, repository, manifest.digest, existing.legacy, layers, types)
    keep = public is not None and signed_by(
        client, repository, manifest.digest, existing.signature, public
    )
    if keep:
        found = discover.signature_manifest(client, repository, manifest.digest)
        signature = found[0] if found else ""
    else:
        signature = _sign(
            client, repository, reference, manifest.digest, existing.signature, signer
        )
    return Attached(signature, attested, indexed_by_api, signer.identity, legacy, not keep, sizes)
