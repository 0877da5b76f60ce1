"""The Kubernetes admission policy that checks on a cluster what ``sparkbuild verify``
checks: a Kyverno ``ClusterPolicy`` whose ``verifyImages`` rule admits a Pod only when its
image is signed by the project's key and carries signed provenance and verdicts.

Kyverno reads signatures and attestations through cosign's library: the signature from the
``.sig`` tag and the attestations from cosign's ``.att`` manifest, which publish writes
beside the OCI referrers. Key-signed images have no transparency-log entry, so the policy
skips the log and the certificate timestamps (``ignoreTlog``, ``ignoreSCT``).

The document is built from pydantic models with Kyverno's field names and dumped by
``yamlfile.dump_yaml``; the tests validate it against Kyverno's own CRD schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from sparkbuild.attest import statements
from sparkbuild.attest.keys import PublicKey
from sparkbuild.yamlfile import dump_yaml


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _named(name: str, python: str, *default: object) -> Any:
    """A field called ``python`` in code and ``name`` (Kyverno's) in the document."""
    return Field(*default, validation_alias=AliasChoices(name, python), serialization_alias=name)


class _Rekor(_Model):
    ignore_tlog: bool = _named("ignoreTlog", "ignore_tlog", True)


class _CTLog(_Model):
    ignore_sct: bool = _named("ignoreSCT", "ignore_sct", True)


class _Keys(_Model):
    public_keys: str = _named("publicKeys", "public_keys")
    rekor: _Rekor = _Rekor()
    ctlog: _CTLog = _CTLog()


class _Attestor(_Model):
    keys: _Keys


class _AttestorSet(_Model):
    entries: list[_Attestor]


class _Condition(_Model):
    key: str
    operator: str
    value: Any


class _Conditions(_Model):
    all: list[_Condition]


class _Attestation(_Model):
    type: str
    attestors: list[_AttestorSet]
    conditions: list[_Conditions] = []


class _VerifyImages(_Model):
    image_references: list[str] = _named("imageReferences", "image_references")
    attestors: list[_AttestorSet]
    attestations: list[_Attestation]
    mutate_digest: bool = _named("mutateDigest", "mutate_digest", True)
    verify_digest: bool = _named("verifyDigest", "verify_digest", True)
    required: bool = True


def _pods() -> dict[str, object]:
    return {"any": [{"resources": {"kinds": ["Pod"]}}]}


def kyverno_policy(public: PublicKey, images: list[str], name: str) -> dict[str, object]:
    """The ClusterPolicy as a mapping (what :func:`render` dumps)."""
    attestors = [_AttestorSet(entries=[_Attestor(keys=_Keys(public_keys=public.pem().decode()))])]
    verdicts = _Attestation(
        type=statements.VERDICTS_PREDICATE,
        attestors=attestors,
        conditions=[
            _Conditions(
                all=[_Condition(key="{{ length(smoke) }}", operator="GreaterThan", value=0)]
            )
        ],
    )
    provenance = _Attestation(type=statements.PROVENANCE_PREDICATE, attestors=attestors)
    rule = _VerifyImages(
        image_references=images, attestors=attestors, attestations=[provenance, verdicts]
    )
    return {
        "apiVersion": "kyverno.io/v1",
        "kind": "ClusterPolicy",
        "metadata": {
            "name": name,
            "annotations": {
                "policies.kyverno.io/title": "sparkbuild signed images",
                "policies.kyverno.io/description": (
                    "Admit sparkbuild images only when signed by the project's key, with "
                    "signed SLSA provenance and smoke verdicts (docs/verify.md)"
                ),
            },
        },
        "spec": {
            "validationFailureAction": "Enforce",
            "background": False,
            "webhookTimeoutSeconds": 30,
            "rules": [
                {
                    "name": "sparkbuild-signed-and-attested",
                    "match": _pods(),
                    "verifyImages": [rule.model_dump(by_alias=True)],
                }
            ],
        },
    }


def render(document: Mapping[str, object]) -> str:
    return dump_yaml(document)
