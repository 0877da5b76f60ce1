"""Push real OCI images, indexes and attestation manifests to a test registry over its HTTP API.

What Docker's containerd image store and ``buildx --push`` put in a registry: an image
manifest per platform, and an OCI index listing them plus BuildKit-style attestation manifests
(platform ``unknown/unknown``, ``vnd.docker.reference.type: attestation-manifest``). The blobs
are small but well-formed (a gzipped tar layer, a config with matching ``diff_ids``), so the
registry stores and serves them like any pushed image.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from typing import Any

import requests

from tests.support.docker_env import LocalRegistry

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
IN_TOTO = "application/vnd.in-toto+json"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Pushed:
    digest: str  # of the manifest (or index)
    size: int
    media_type: str
    config_digest: str | None = None

    def descriptor(self, **extra: Any) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size, **extra}


def push_blob(registry: LocalRegistry, repository: str, data: bytes) -> str:
    digest = _digest(data)
    started = requests.post(
        f"{registry.url}/v2/{repository}/blobs/uploads/", auth=registry.auth, timeout=30
    )
    started.raise_for_status()
    location = started.headers["Location"]
    if location.startswith("/"):
        location = registry.url + location
    separator = "&" if "?" in location else "?"
    done = requests.put(
        f"{location}{separator}digest={digest}",
        data=data,
        headers={"Content-Type": "application/octet-stream"},
        auth=registry.auth,
        timeout=30,
    )
    done.raise_for_status()
    return digest


def put_manifest(
    registry: LocalRegistry, repository: str, reference: str | None, body: dict[str, Any]
) -> Pushed:
    """PUT ``body`` under ``reference`` (a tag), or untagged by its own digest."""
    data = json.dumps(body, separators=(",", ":")).encode()
    response = requests.put(
        f"{registry.url}/v2/{repository}/manifests/{reference or _digest(data)}",
        data=data,
        headers={"Content-Type": body["mediaType"]},
        auth=registry.auth,
        timeout=30,
    )
    response.raise_for_status()
    assert response.headers["Docker-Content-Digest"] == _digest(data)
    config = body.get("config", {}).get("digest")
    return Pushed(_digest(data), len(data), body["mediaType"], config)


def _layer(text: str) -> tuple[bytes, str]:
    """A gzipped tar with one file; returns (blob, diff_id of the uncompressed tar)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        payload = text.encode()
        info = tarfile.TarInfo("etc/sparkbuild-test")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    return gzip.compress(raw.getvalue(), mtime=0), _digest(raw.getvalue())


def push_image(registry: LocalRegistry, repository: str, platform: str, text: str) -> Pushed:
    """An image manifest (by digest, untagged) for ``platform`` with one layer holding ``text``."""
    os_name, architecture = platform.split("/")[:2]
    layer, diff_id = _layer(text)
    config = json.dumps(
        {
            "architecture": architecture,
            "os": os_name,
            "config": {"Cmd": ["true"]},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    ).encode()
    body = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": push_blob(registry, repository, config),
                   "size": len(config)},
        "layers": [{"mediaType": OCI_LAYER, "digest": push_blob(registry, repository, layer),
                    "size": len(layer)}],
    }  # fmt: skip
    return put_manifest(registry, repository, None, body)


def push_attestation(registry: LocalRegistry, repository: str, subject: Pushed) -> Pushed:
    """A BuildKit-style provenance attestation manifest for ``subject``."""
    statement = json.dumps(
        {"_type": "https://in-toto.io/Statement/v0.1", "subject": [{"digest": {
            "sha256": subject.digest.removeprefix("sha256:")}}],
         "predicateType": "https://slsa.dev/provenance/v0.2", "predicate": {}}
    ).encode()  # fmt: skip
    config = b"{}"
    body = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": push_blob(registry, repository, config),
                   "size": len(config)},
        "layers": [{"mediaType": IN_TOTO, "digest": push_blob(registry, repository, statement),
                    "size": len(statement),
                    "annotations": {"in-toto.io/predicate-type": "https://slsa.dev/provenance/v0.2"}}],
    }  # fmt: skip
    return put_manifest(registry, repository, None, body)


def push_index(
    registry: LocalRegistry,
    repository: str,
    tag: str,
    images: dict[str, Pushed],
    *,
    attest: bool = True,
) -> Pushed:
    """An OCI index tagged ``tag``: one entry per platform, plus an attestation for each."""
    manifests = []
    for platform, image in images.items():
        os_name, architecture = platform.split("/")[:2]
        manifests.append(image.descriptor(platform={"os": os_name, "architecture": architecture}))
        if attest:
            attestation = push_attestation(registry, repository, image)
            manifests.append(
                attestation.descriptor(
                    platform={"os": "unknown", "architecture": "unknown"},
                    annotations={
                        "vnd.docker.reference.digest": image.digest,
                        "vnd.docker.reference.type": "attestation-manifest",
                    },
                )
            )
    body = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
    return put_manifest(registry, repository, tag, body)


def tag_manifest(registry: LocalRegistry, repository: str, tag: str, image: Pushed) -> None:
    """Point ``tag`` at an already pushed manifest (same bytes, same digest)."""
    response = requests.get(
        f"{registry.url}/v2/{repository}/manifests/{image.digest}",
        headers={"Accept": image.media_type},
        auth=registry.auth,
        timeout=30,
    )
    response.raise_for_status()
    put_manifest(registry, repository, tag, response.json())
