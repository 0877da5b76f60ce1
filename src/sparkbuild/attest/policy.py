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

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from sparkbuild.attest import statements
from sparkbuild.attest.keys import PublicKey
from sparkbuild.errors import UsageError
from sparkbuild.lockfile import LockFile, PublishRecord
from sparkbuild.yamlfile import dump_yaml

#: A ClusterPolicy's name: an RFC 1123 label (Kyverno uses it as a label value, at most 63).
_NAME = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?\Z")
_PATTERN_LIMIT = 255
_PATTERN_HINT = "e.g. --image 'ghcr.io/my-org/sparkbuild/*' (docs/verify.md)"


def check_name(name: str) -> str:
    """``name`` when Kubernetes takes it as the policy's name; a UsageError otherwise."""
    if not _NAME.match(name):
        raise UsageError(
            f"--name {name[:80]!r} is not a Kubernetes name: lower-case letters, digits and "
            "'-', starting and ending with a letter or digit, at most 63 characters",
            "e.g. --name sparkbuild-signed-images",
        )
    return name


def pattern_problem(pattern: str) -> str | None:
    """Why Kyverno would match no image with ``pattern``, or None. Kyverno matches the
    wildcard pattern (``*``, ``?``) against a Pod's image as a full reference: the registry
    host first (``docker.io`` for Docker Hub's), a lower-case repository, then a tag or
    digest (``:latest`` added when there is none)."""
    if not pattern or len(pattern) > _PATTERN_LIMIT or any(c.isspace() for c in pattern):
        return "is empty, too long or holds white space"
    if not pattern.isprintable() or "://" in pattern:
        return "is a URL or holds control characters, not an image reference"
    first, _, rest = pattern.partition("/")
    host = "." in first or ":" in first or first == "localhost"
    if "*" not in first and not (rest and host):
        return f"names no registry: Kyverno matches the full reference ({first!r} is no host)"
    repository = re.split(r"[:@]", rest, maxsplit=1)[0]
    if repository != repository.lower():
        return "has upper-case letters in its repository, which no image reference has"
    if not pattern.endswith("*") and not re.search(r"[:@][^/]*\Z", pattern):
        return "matches no tag or digest: every image a Pod runs has one"
    return None


def check_patterns(patterns: Iterable[str]) -> list[str]:
    """The ``--image`` patterns, each one that can match an image; a UsageError otherwise."""
    checked = []
    for pattern in patterns:
        why = pattern_problem(pattern)
        if why is not None:
            raise UsageError(f"--image {pattern[:120]!r} {why}", _PATTERN_HINT)
        checked.append(pattern)
    return checked


def unpublished(patterns: Iterable[str], lock: LockFile) -> list[str]:
    """A warning for each pattern that matches none of the references ``lock`` records as
    published (by tag, alias or digest); none when nothing was published yet."""
    published = [
        reference
        for entry in lock.builds.values()
        for repository, record in (entry.publish or {}).items()
        for reference in _references(repository, record)
    ]
    return [
        f"--image {pattern!r} matches none of the {len(published)} image references this "
        f"project published (e.g. {published[0]})"
        for pattern in patterns
        if published and not any(matches(pattern, reference) for reference in published)
    ]


def _references(repository: str, record: PublishRecord) -> list[str]:
    tags = [t for t in (record.tag, *record.aliases) if t]
    digests = {d for d in (record.digest, *(h.digest for h in record.history)) if d}
    return [f"{repository}:{t}" for t in tags] + [f"{repository}@{d}" for d in sorted(digests)]


def matches(pattern: str, reference: str) -> bool:
    """Whether Kyverno's wildcard ``pattern`` matches ``reference``: ``*`` any run of
    characters (``/`` too), ``?`` one."""
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch("".join(parts), reference, flags=re.DOTALL) is not None


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
