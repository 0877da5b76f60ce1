"""Verifying a published image: its signature, each attestation's signature and subject,
the provenance against images.lock, and the verdicts against the build's profiles.

Each check is a named :class:`Finding` that passed or failed, with what it saw. Nothing is
trusted before its signature verified with the key: a statement is read only from an
envelope that verifies, about this very digest, from a referrer whose subject is this image.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from sparkbuild import jsontext, lockfile
from sparkbuild.attest import discover, layout, signing, statements
from sparkbuild.attest.device_code import check_device_code
from sparkbuild.attest.keys import PublicKey
from sparkbuild.console import clipped
from sparkbuild.errors import (
    AttestationError,
    ReferrersError,
    SignatureError,
    SparkbuildError,
)
from sparkbuild.jsontext import JsonObject
from sparkbuild.registry.client import RegistryClient

_SHOWN = 120  # characters of a registry's value a finding quotes


@dataclass(frozen=True)
class Finding:
    name: str  # signature, attestation:<kind>, provenance-lock, verdicts-smoke
    ok: bool
    detail: str
    error: str | None = None  # the named error's class, when it failed

    def to_json(self) -> JsonObject:
        return {"name": self.name, "ok": self.ok, "detail": self.detail, "error": self.error}


@dataclass
class Verification:
    reference: str  # HOST/REPOSITORY@DIGEST
    digest: str
    key: str  # the key's fingerprint
    findings: list[Finding] = field(default_factory=list)
    predicates: dict[str, dict[str, object]] = field(default_factory=dict)  # kind -> predicate
    build: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.findings) and all(f.ok for f in self.findings)

    def failed(self, error: SparkbuildError, name: str) -> None:
        self.findings.append(Finding(name, False, error.message, type(error).__name__))

    def to_json(self) -> JsonObject:
        return {
            "reference": self.reference,
            "digest": self.digest,
            "key": self.key,
            "build": self.build,
            "ok": self.ok,
            "findings": [f.to_json() for f in self.findings],
        }


# --- the signature -------------------------------------------------------------------------


def _payload(data: bytes) -> layout.SigningPayload | None:
    try:
        return layout.SigningPayload.model_validate_json(data)
    except ValueError:
        return None


def signature_findings(
    client: RegistryClient,
    repository: str,
    digest: str,
    signature: layout.ImageManifest,
    public: PublicKey,
) -> tuple[bool, str]:
    """(verified, what was seen): one simple-signing layer of ``signature`` must verify with
    ``public`` and name ``digest``."""
    seen: list[str] = []
    for layer in signature.layers:
        encoded = (layer.annotations or {}).get(layout.SIGNATURE_ANNOTATION)
        if layer.media_type != layout.SIMPLE_SIGNING or not encoded:
            continue
        try:  # a payload that is not its digest's bytes is one more thing seen, not a crash
            data = discover.blob(client, repository, layer, layout.PAYLOAD_LIMIT)
        except ReferrersError as exc:
            seen.append(f"a signed payload that cannot be read ({clipped(exc.message)})")
            continue
        try:
            raw = _b64(encoded)
        except ValueError:
            seen.append("a signature that is not base64")
            continue
        if not signing.verify_bytes(public, data, raw):
            seen.append(
                "a signature that does not verify with this key (another key's, or tampered)"
            )
            continue
        payload = _payload(data)
        if payload is None or payload.critical.type != layout.SIGNATURE_TYPE:
            seen.append("a signed payload that is not a cosign image signature")
        elif payload.critical.image.docker_manifest_digest != digest:
            seen.append(f"a signature of {clipped(payload.critical.image.docker_manifest_digest)}")
        else:
            identity = clipped(payload.critical.identity.docker_reference)
            return True, f"signed by {public.fingerprint[:19]} as {identity}"
    return False, "; ".join(seen) or "no simple-signing layer"


def _b64(text: str) -> bytes:
    import base64
    import binascii

    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError(str(exc)) from None


def check_signature(
    client: RegistryClient, repository: str, digest: str, public: PublicKey
) -> Finding:
    """The ``signature`` finding; raises SignatureError when it cannot be read at all."""
    found = discover.signature_manifest(client, repository, digest)
    where = f"{client.registry.host}/{repository}@{digest}"
    if found is None:
        return Finding(
            "signature",
            False,
            f"{where} is not signed (no {layout.signature_tag(digest)} tag)",
            "SignatureError",
        )
    ok, detail = signature_findings(client, repository, digest, found[1], public)
    return Finding(
        "signature", ok, detail if ok else f"{where}: {detail}", None if ok else "SignatureError"
    )


def require_signature(
    client: RegistryClient, repository: str, digest: str, public: PublicKey, what: str
) -> None:
    """Raise SignatureError (naming ``what``) unless ``digest`` is signed by ``public``."""
    finding = check_signature(client, repository, digest, public)
    if not finding.ok:
        raise SignatureError(
            f"{what}: {finding.detail}",
            f"only images signed by {public.fingerprint[:19]} ({public.source}) are accepted; "
            "`sparkbuild verify REF@DIGEST` shows what is attached",
        )


# --- attestations --------------------------------------------------------------------------


def _statement(
    client: RegistryClient,
    repository: str,
    digest: str,
    referrer: discover.Referrer,
    public: PublicKey,
) -> dict[str, object]:
    where = f"{client.registry.host}/{repository}@{referrer.digest}"
    layers = [x for x in referrer.manifest.layers if x.media_type == layout.DSSE_ENVELOPE]
    if len(layers) != 1:
        raise AttestationError(f"{where}: holds {len(layers)} DSSE envelopes, not one")
    data = discover.blob(client, repository, layers[0], layout.ENVELOPE_LIMIT)
    try:
        opened = signing.open_envelope(jsontext.loads(data))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise AttestationError(f"{where}: not a DSSE envelope") from None
    if opened.payload_type != signing.IN_TOTO_PAYLOAD:
        shown = clipped(repr(opened.payload_type), _SHOWN)  # the registry's text: bounded
        raise AttestationError(f"{where}: payload type {shown} is not in-toto")
    if not signing.envelope_verifies(opened, public):
        raise AttestationError(
            f"{where}: the envelope's signature does not verify with this key (another key's, "
            "or tampered)"
        )
    try:
        statement = jsontext.loads(opened.payload)
    except ValueError:
        raise AttestationError(f"{where}: the signed payload is not JSON") from None
    if not isinstance(statement, dict) or statement.get("_type") != statements.STATEMENT_TYPE:
        raise AttestationError(f"{where}: not an in-toto Statement v1")
    subjects = statement.get("subject")
    digests = {
        f"sha256:{s.get('digest', {}).get('sha256', '')}"
        for s in (subjects if isinstance(subjects, list) else [])
        if isinstance(s, dict) and isinstance(s.get("digest"), dict)
    }
    if digest not in digests:
        shown = clipped(", ".join(sorted(digests)) or "nothing", _SHOWN)
        raise AttestationError(
            f"{where}: a signed statement about {shown}, not {digest}; nothing from it is trusted",
            "an attestation of another image was attached to this one; publish again",
        )
    return statement


def check_attestations(
    client: RegistryClient, repository: str, digest: str, public: PublicKey, result: Verification
) -> None:
    """One ``attestation:<kind>`` finding per kind, and the verified predicates."""
    try:
        entries, from_api = discover.referrer_descriptors(
            client, repository, digest, layout.ATTESTATION_ARTIFACT
        )
        referrers = [discover.referrer(client, repository, digest, e) for e in entries]
    except ReferrersError as exc:
        result.failed(exc, "referrers")
        return
    found: dict[str, list[str]] = {}
    failures: dict[str, SparkbuildError] = {}
    for item in referrers:
        kind = _kind((item.manifest.annotations or {}).get(layout.PREDICATE_ANNOTATION, ""))
        try:
            statement = _statement(client, repository, digest, item, public)
        except (AttestationError, ReferrersError) as exc:
            failures[kind] = exc
            continue
        if _kind(str(statement.get("predicateType"))) != kind:
            failures[kind] = AttestationError(
                f"{item.digest}: predicate type differs from its annotation"
            )
            continue
        predicate = statement.get("predicate")
        result.predicates[kind] = predicate if isinstance(predicate, dict) else {}
        found.setdefault(kind, []).append(item.digest)
    source = "referrers API" if from_api else f"tag {layout.fallback_tag(digest)}"
    for kind in statements.KINDS:
        if kind in failures:
            result.failed(failures[kind], f"attestation:{kind}")
        elif kind in found:
            result.findings.append(
                Finding(f"attestation:{kind}", True, f"{found[kind][-1]} ({source})")
            )
        else:
            result.findings.append(
                Finding(
                    f"attestation:{kind}", False, f"none attached ({source})", "AttestationError"
                )
            )


def _kind(predicate_type: str) -> str:
    for kind, uri in statements.KINDS.items():
        if uri == predicate_type:
            return kind
    return predicate_type or "unknown"


# --- against the lock ----------------------------------------------------------------------


def _dependencies(predicate: dict[str, Any]) -> dict[str, dict[str, str]]:
    definition = predicate.get("buildDefinition") or {}
    found = {}
    for item in definition.get("resolvedDependencies") or []:
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            digest = item.get("digest")
            pairs = digest.items() if isinstance(digest, dict) else []
            found[item["name"]] = {str(k): str(v) for k, v in pairs}
    return found


def provenance_build(predicate: dict[str, Any]) -> str | None:
    parameters = (predicate.get("buildDefinition") or {}).get("externalParameters") or {}
    build = parameters.get("build") if isinstance(parameters, dict) else None
    return clipped(build) if build else None


def check_provenance(
    predicate: dict[str, Any], entry: lockfile.BuildEntry | None, build: str
) -> Finding:
    """The provenance names what images.lock pins for ``build``."""
    if entry is None or entry.source is None:
        return Finding(
            "provenance-lock", False, f"images.lock has no source for {build}", "AttestationError"
        )
    expected = statements.dependency_digests(entry)
    got = _dependencies(predicate)
    differ = [
        f"{name}: attested {clipped(got.get(name) or 'nothing')}, locked {digest or 'nothing'}"
        for name, digest in expected.items()
        if got.get(name, {}) != digest
    ]
    differ += [
        f"{clipped(name)}: attested, not in images.lock" for name in got if name not in expected
    ]
    if differ:
        return Finding(
            "provenance-lock",
            False,
            f"the provenance differs from images.lock's {build}: " + "; ".join(differ[:6]),
            "AttestationError",
        )
    commit = str(entry.source.commit or "")[:12]
    return Finding(
        "provenance-lock",
        True,
        f"commit {commit}, {len(entry.source.prs)} PR(s), "
        f"{len(entry.source.patches)} patch(es), base and wheels as images.lock pins",
    )


def check_verdicts(
    predicate: Mapping[str, object], profiles: tuple[str, ...], image_id: str | None
) -> Finding:
    """A verified passing smoke verdict of this image for every profile the build lists."""
    if not profiles:
        return Finding(
            "verdicts-smoke", False, "the build lists no smoke profiles", "AttestationError"
        )
    image = predicate.get("image")
    image = image if isinstance(image, dict) else {}
    verdicts = statements.passing_profiles(predicate, profiles)
    failing = {p: clipped(v) for p, v in verdicts.items() if v != "pass"}
    if image_id and image.get("imageId") != image_id:
        failing["image"] = f"verdicts about {clipped(image.get('imageId'))}, not {image_id}"
    if failing:
        listed = ", ".join(f"{p}: {v}" for p, v in failing.items())
        return Finding("verdicts-smoke", False, listed, "AttestationError")
    return Finding("verdicts-smoke", True, "pass: " + ", ".join(profiles))


def verify_image(
    client: RegistryClient, repository: str, digest: str, public: PublicKey
) -> Verification:
    """The signature and attestation findings of ``repository@digest`` (not the lock's)."""
    reference = f"{client.registry.reference(repository)}@{digest}"
    result = Verification(reference, digest, public.fingerprint)
    try:
        result.findings.append(check_signature(client, repository, digest, public))
    except SignatureError as exc:
        result.failed(exc, "signature")
    check_attestations(client, repository, digest, public, result)
    provenance = result.predicates.get("provenance")
    result.build = provenance_build(provenance) if provenance else None
    return result


def dumps(verification: Verification) -> str:
    return json.dumps(verification.to_json(), indent=2)


__all__ = [
    "Finding",
    "ValidationError",
    "Verification",
    "check_provenance",
    "check_signature",
    "check_verdicts",
    "require_signature",
    "verify_image",
]


def _image_id(entry: lockfile.BuildEntry | None, digest: str, predicate: dict[str, Any]) -> str:
    """The image id the lock published as ``digest`` (else the one the provenance names)."""
    for record in ((entry.publish if entry else None) or {}).values():
        for item in record.published():
            if item.digest == digest and item.image_id:
                return str(item.image_id)
    parameters = (predicate.get("buildDefinition") or {}).get("internalParameters") or {}
    return str(parameters.get("imageId") or "") if isinstance(parameters, dict) else ""


def check_project(
    result: Verification, profiles: dict[str, tuple[str, ...]], lock: lockfile.LockFile
) -> None:
    """Add the ``provenance-lock`` and ``verdicts-smoke`` findings: the provenance against the
    lock's entry of the build it names, the verdicts against that build's profiles
    (``profiles``: build -> its smoke profiles, from builds/)."""
    provenance = result.predicates.get("provenance")
    build = result.build
    if provenance is None or build is None:
        for name in ("provenance-lock", "verdicts-smoke"):
            result.findings.append(
                Finding(name, False, "no verified provenance names the build", "AttestationError")
            )
        return
    if build not in profiles:
        for name in ("provenance-lock", "verdicts-smoke"):
            result.findings.append(
                Finding(
                    name,
                    False,
                    f"the provenance names build {build!r}, which builds/ does not define",
                    "AttestationError",
                )
            )
        return
    entry = lock.entry(build)
    result.findings.append(check_provenance(provenance, entry, build))
    ok, detail = check_device_code(result.predicates.get("sbom"))
    result.findings.append(Finding("device-code", ok, detail, None if ok else "AuditError"))
    image_id = _image_id(entry, result.digest, provenance)
    verdicts = result.predicates.get("verdicts")
    if verdicts is None:
        result.findings.append(
            Finding("verdicts-smoke", False, "no verified verdicts", "AttestationError")
        )
    else:
        finding = check_verdicts(verdicts, profiles[build], image_id or None)
        result.findings.append(_overruled(finding, entry, image_id, profiles[build]))


def _overruled(
    finding: Finding, entry: lockfile.BuildEntry | None, image_id: str, profiles: tuple[str, ...]
) -> Finding:
    """``finding`` failed when images.lock now records a smoke verdict other than a pass for
    this image (a run after the publish): the signed pass is what was true then."""
    records = ((entry.smoke if entry else None) or {}).get(image_id) or {}
    later = {p: r.verdict for p in profiles if (r := records.get(p)) and r.verdict != "pass"}
    if not finding.ok or not image_id or not later:
        return finding
    listed = ", ".join(f"{p}: {v or 'no verdict'}" for p, v in later.items())
    return Finding(
        "verdicts-smoke",
        False,
        f"{finding.detail} when signed, but images.lock now records {listed} for this image",
        "AttestationError",
    )
