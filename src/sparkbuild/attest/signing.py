"""Who signs: a key pair (cosign's format) or, in CI, Sigstore's keyless flow; and DSSE.

Both signers make ECDSA P-256 signatures over SHA-256 (DER encoded), which is what cosign
and containers/image check. The key pair's signer is the default; the keyless one (GitHub
OIDC -> Fulcio certificate -> Rekor entry, through sigstore-python) adds the certificate and
the log entry as annotations cosign defines. Everything else (the payloads, the envelopes,
where they are stored) is the same for both.

DSSE envelopes use securesystemslib's ``Envelope`` (its pre-authentication encoding and
JSON form); the signature's ``keyid`` is empty, as cosign writes it, so any verifier that
holds the public key accepts it.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from securesystemslib.dsse import Envelope
from securesystemslib.signer._signature import Signature

from sparkbuild.attest.keys import PrivateKey, PublicKey
from sparkbuild.errors import MissingExtraError, SigningKeyError

IN_TOTO_PAYLOAD = "application/vnd.in-toto+json"
CERTIFICATE_ANNOTATION = "dev.sigstore.cosign/certificate"
CHAIN_ANNOTATION = "dev.sigstore.cosign/chain"
BUNDLE_ANNOTATION = "dev.sigstore.cosign/bundle"


class Signer(Protocol):
    """Signs bytes; says how a verifier knows who signed (``identity``)."""

    @property
    def identity(self) -> str:
        """The public key's fingerprint, or the keyless certificate's subject."""
        ...

    def sign(self, data: bytes) -> bytes:
        """An ECDSA P-256 / SHA-256 signature over ``data``, DER encoded."""
        ...

    def annotations(self, data: bytes, signature: bytes) -> dict[str, str]:
        """What a simple-signing layer carries beside the signature (keyless: certificate,
        chain, transparency log entry)."""
        ...


@dataclass(frozen=True)
class KeySigner:
    key: PrivateKey = field(repr=False)

    @property
    def identity(self) -> str:
        return self.key.public.fingerprint

    @property
    def public(self) -> PublicKey:
        return self.key.public

    def sign(self, data: bytes) -> bytes:
        return self.key.key.sign(data, ec.ECDSA(hashes.SHA256()))

    def annotations(self, data: bytes, signature: bytes) -> dict[str, str]:
        return {}


class KeylessSigner:
    """Sigstore's keyless signing (sigstore-python, the ``keyless`` extra): an OIDC identity
    token (GitHub Actions' own, with ``id-token: write``) buys a short-lived Fulcio
    certificate for an ephemeral key, and each signature is logged in Rekor."""

    def __init__(self) -> None:
        try:
            from sigstore.oidc import IdentityToken, detect_credential
            from sigstore.sign import ClientTrustConfig, SigningContext
        except ImportError:
            raise MissingExtraError(
                "keyless signing needs sigstore-python",
                "pip install 'sparkbuild[keyless]'",
            ) from None
        credential = detect_credential()
        if not credential:
            raise SigningKeyError(
                "keyless signing found no OIDC identity token (this runs in GitHub Actions "
                "with `permissions: id-token: write`)",
                "sign with a key pair instead: --sign-key FILE",
            )
        context = SigningContext.from_trust_config(ClientTrustConfig.production())
        self._signer_context = context.signer(IdentityToken(credential), cache=True)
        self._signer = self._signer_context.__enter__()
        self._bundles: dict[bytes, Any] = {}

    @property
    def identity(self) -> str:
        return "keyless"

    def sign(self, data: bytes) -> bytes:
        bundle = self._signer.sign_artifact(data)
        self._bundles[data] = bundle
        return bytes(bundle.signature)

    def annotations(self, data: bytes, signature: bytes) -> dict[str, str]:
        bundle = self._bundles[data]
        certificate = bundle.signing_certificate.public_bytes(serialization.Encoding.PEM)
        entry = bundle.log_entry
        rekor = {
            "SignedEntryTimestamp": base64.b64encode(entry.inclusion_promise or b"").decode(),
            "Payload": {
                "body": base64.b64encode(entry.body).decode(),
                "integratedTime": entry.integrated_time,
                "logIndex": entry.log_index,
                "logID": entry.log_id,
            },
        }
        return {
            CERTIFICATE_ANNOTATION: certificate.decode(),
            CHAIN_ANNOTATION: "",
            BUNDLE_ANNOTATION: json.dumps(rekor, separators=(",", ":")),
        }


def verify_bytes(public: PublicKey, data: bytes, signature: bytes) -> bool:
    """Whether ``signature`` (DER) is ``public``'s ECDSA P-256 signature over ``data``."""
    try:
        public.key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        return False
    return True


def envelope(statement: bytes, signer: Signer) -> dict[str, Any]:
    """A DSSE envelope of ``statement`` (an in-toto Statement), signed by ``signer``."""
    unsigned = Envelope(statement, IN_TOTO_PAYLOAD, {})
    signature = signer.sign(unsigned.pae())
    unsigned.signatures[""] = Signature(keyid="", sig=signature.hex())
    return unsigned.to_dict()


def open_envelope(data: dict[str, Any]) -> Envelope:
    """A DSSE envelope from its JSON form; ValueError (or KeyError, TypeError) if it is not
    one."""
    copy = {**data, "signatures": [dict(s) for s in data.get("signatures") or []]}
    return Envelope.from_dict(copy)


def envelope_verifies(opened: Envelope, public: PublicKey) -> bool:
    """Whether one of the envelope's signatures is ``public``'s over its PAE."""
    pae = opened.pae()
    return any(
        verify_bytes(public, pae, bytes.fromhex(signature.signature))
        for signature in opened.signatures.values()
    )
