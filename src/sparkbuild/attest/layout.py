"""Where signatures and attestations live in a registry, and their exact shapes.

- **The image signature** is cosign's *simple signing* layout, which containers/image
  (skopeo, podman, CRI-O) reads with ``use-sigstore-attachments: true`` and cosign with
  ``--key``: a manifest tagged ``sha256-<hex>.sig`` in the image's repository, one layer per
  signature, each layer's blob the JSON payload naming the image's manifest digest, its
  signature (base64, DER) in the ``dev.cosignproject.cosign/signature`` annotation.
- **Attestations** are DSSE envelopes of in-toto Statements. Each is an OCI 1.1 *referrer*:
  a manifest whose ``subject`` is the image and whose ``artifactType`` is
  ``application/vnd.in-toto+json``, its one layer the envelope. A registry with the
  referrers API indexes them itself (it answers the PUT with ``OCI-Subject``); for one
  without (Distribution 2.8, GHCR) they are listed in the *referrers tag schema*'s index,
  tagged ``sha256-<hex>``. The same envelopes are also listed as layers of cosign's
  ``sha256-<hex>.att`` manifest, which ``cosign verify-attestation``, Kyverno and
  policy-controller read (the blobs are shared: nothing is stored twice).

Everything read back is registry data: it is parsed into the models below (bounded counts,
strict digests), and every use checks the subject and the artifact type again, since a
registry may answer a missing tag with the image itself (GHCR does).
"""

from __future__ import annotations

import base64
import json
from typing import Annotated, Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from sparkbuild.registry.address import Manifest

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
EMPTY_CONFIG = "application/vnd.oci.empty.v1+json"
EMPTY_JSON = b"{}"
SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
SIGNATURE_TYPE = "cosign container image signature"
DSSE_ENVELOPE = "application/vnd.dsse.envelope.v1+json"
ATTESTATION_ARTIFACT = "application/vnd.in-toto+json"
PREDICATE_ANNOTATION = "in-toto.io/predicate-type"
COSIGN_PREDICATE_ANNOTATION = "predicateType"  # cosign's own, on the .att layers
#: More entries than any image carries; a longer index is refused, not walked.
MAX_ENTRIES = 256
#: A referrers index or signature manifest of MAX_ENTRIES descriptors fits well within this.
INDEX_LIMIT = 512 * 1024
#: An envelope holds an SBOM: a few thousand packages at most.
ENVELOPE_LIMIT = 8 * 1024 * 1024
PAYLOAD_LIMIT = 64 * 1024

Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


def _json_name(name: str, python: str, **rules: Any) -> Any:
    """A field named ``python`` in code and ``name`` in the JSON (both read)."""
    return Field(validation_alias=AliasChoices(name, python), serialization_alias=name, **rules)


class Descriptor(BaseModel):
    model_config = ConfigDict(extra="allow")
    media_type: str = _json_name("mediaType", "media_type")
    digest: Digest
    size: int = Field(ge=0)
    artifact_type: str | None = _json_name("artifactType", "artifact_type", default=None)
    annotations: dict[str, str] | None = None
    data: str | None = None


class ImageManifest(BaseModel):
    model_config = ConfigDict(extra="allow")
    schema_version: int = _json_name("schemaVersion", "schema_version")
    media_type: str | None = _json_name("mediaType", "media_type", default=None)
    artifact_type: str | None = _json_name("artifactType", "artifact_type", default=None)
    config: Descriptor
    layers: list[Descriptor] = Field(max_length=MAX_ENTRIES)
    subject: Descriptor | None = None
    annotations: dict[str, str] | None = None


class Index(BaseModel):
    model_config = ConfigDict(extra="allow")
    schema_version: int = _json_name("schemaVersion", "schema_version")
    media_type: str | None = _json_name("mediaType", "media_type", default=None)
    manifests: list[Descriptor] = Field(max_length=MAX_ENTRIES)


def to_bytes(model: BaseModel) -> bytes:
    """The canonical bytes of a manifest or index: the same model gives the same digest."""
    data = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return json.dumps(data, separators=(",", ":")).encode()


def parse_manifest(body: bytes) -> ImageManifest:
    """Raises ValueError (pydantic's ValidationError is one) for anything else."""
    return ImageManifest.model_validate_json(body)


def parse_index(body: bytes) -> Index:
    return Index.model_validate_json(body)


def problem(exc: ValueError) -> str:
    """What was wrong, in one line, for an error message."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "document"
        return f"{where}: {first['msg']}"
    return str(exc).splitlines()[0][:200]


def signature_tag(digest: str) -> str:
    return digest.replace(":", "-") + ".sig"


def attestation_tag(digest: str) -> str:
    return digest.replace(":", "-") + ".att"


def fallback_tag(digest: str) -> str:
    """The referrers tag schema's tag for ``digest``."""
    return digest.replace(":", "-")


def subject_of(manifest: Manifest) -> Descriptor:
    return Descriptor(
        media_type=manifest.media_type, digest=manifest.digest, size=len(manifest.body)
    )


# --- the simple-signing payload ---------------------------------------------------------------


def simple_signing_payload(reference: str, digest: str, creator: str, timestamp: int) -> bytes:
    """What the image signature signs: the repository and the manifest digest."""
    payload: dict[str, object] = {
        "critical": {
            "identity": {"docker-reference": reference},
            "image": {"docker-manifest-digest": digest},
            "type": SIGNATURE_TYPE,
        },
        "optional": {"creator": creator, "timestamp": timestamp},
    }
    return json.dumps(payload, separators=(",", ":")).encode()


class _Identity(BaseModel):
    docker_reference: str = Field(alias="docker-reference")


class _Image(BaseModel):
    docker_manifest_digest: str = Field(alias="docker-manifest-digest")


class _Critical(BaseModel):
    identity: _Identity
    image: _Image
    type: str


class SigningPayload(BaseModel):
    critical: _Critical
    optional: dict[str, object] | None = None


def cosign_config(diff_ids: list[str]) -> bytes:
    """The config cosign gives its signature and attestation manifests (an empty image whose
    layers are the payloads)."""
    zero = "0001-01-01T00:00:00Z"
    config = {
        "architecture": "",
        "created": zero,
        "history": [{"created": zero}],
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "config": {},
    }
    return json.dumps(config, separators=(",", ":")).encode()


def signature_layer(
    payload_digest: str, size: int, signature: bytes, extra: dict[str, str]
) -> Descriptor:
    annotations = {SIGNATURE_ANNOTATION: base64.b64encode(signature).decode(), **extra}
    return Descriptor(
        media_type=SIMPLE_SIGNING, digest=payload_digest, size=size, annotations=annotations
    )


def attestation_manifest(
    subject: Descriptor, envelope: Descriptor, predicate_type: str, created: str
) -> ImageManifest:
    """An OCI 1.1 referrer holding one DSSE envelope about ``subject``."""
    return ImageManifest(
        schema_version=2,
        media_type=OCI_MANIFEST,
        artifact_type=ATTESTATION_ARTIFACT,
        config=empty_config(),
        layers=[envelope],
        subject=subject,
        annotations={
            PREDICATE_ANNOTATION: predicate_type,
            "org.opencontainers.image.created": created,
        },
    )


def empty_config() -> Descriptor:
    from sparkbuild.registry.address import sha256_digest

    return Descriptor(
        media_type=EMPTY_CONFIG,
        digest=sha256_digest(EMPTY_JSON),
        size=len(EMPTY_JSON),
        data=base64.b64encode(EMPTY_JSON).decode(),
    )


def referrer_descriptor(digest: str, body: bytes, manifest: ImageManifest) -> Descriptor:
    """The index entry of a referrer: its artifact type and annotations copied up, so a
    client can filter without fetching it."""
    return Descriptor(
        media_type=OCI_MANIFEST,
        digest=digest,
        size=len(body),
        artifact_type=manifest.artifact_type,
        annotations=manifest.annotations,
    )


def cosign_manifest(layers: list[Descriptor], config: Descriptor) -> ImageManifest:
    return ImageManifest(schema_version=2, media_type=OCI_MANIFEST, config=config, layers=layers)
