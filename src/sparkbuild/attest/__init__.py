"""Signed, attested images: what travels with a published image so anyone can check it.

- ``keys``: ECDSA P-256 key pairs in cosign's encrypted format (``sparkbuild keys``);
- ``signing``: the signers (a key pair, or Sigstore's keyless flow in CI) and DSSE;
- ``layout``: where signatures and attestations live in a registry, and their shapes
  (cosign's simple signing, OCI 1.1 referrers, the referrers tag schema, cosign's ``.att``);
- ``contents`` and ``sbom``: the image's OS packages and Python distributions as CycloneDX;
- ``statements``: in-toto Statements: SLSA provenance from images.lock, the verdicts, the SBOM;
- ``attach``: signing and attaching after a push (publish);
- ``discover`` and ``verify``: reading attachments back, bounded, and the named findings of
  ``sparkbuild verify`` (and of rollback, smoke and bench before they trust an image);
- ``policy``: the Kubernetes admission policies that check the same on a cluster.
"""

from sparkbuild.attest.attach import Attached, sign_and_attach
from sparkbuild.attest.keys import PrivateKey, PublicKey
from sparkbuild.attest.signing import KeySigner, Signer
from sparkbuild.attest.verify import Finding, Verification, verify_image

__all__ = [
    "Attached",
    "Finding",
    "KeySigner",
    "PrivateKey",
    "PublicKey",
    "Signer",
    "Verification",
    "sign_and_attach",
    "verify_image",
]
