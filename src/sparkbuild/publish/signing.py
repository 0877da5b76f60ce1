"""Signing a publication: after the push, the image's SBOM, provenance and verdicts are
attached as signed attestations and its digest is signed (see docs/verify.md).

Only what the gates passed is signed: a ``--force`` publication is pushed unsigned. What was
attached is read back and verified with the signer's key before the aliases move and the
lock records it; a failure there leaves the aliases and the lock as they were.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name

from sparkbuild import console, dockerhost, lockfile
from sparkbuild.adapters import adapter_type
from sparkbuild.attest import contents, sbom, statements
from sparkbuild.attest.attach import sign_and_attach
from sparkbuild.attest.keys import PublicKey
from sparkbuild.attest.signing import Signer
from sparkbuild.attest.verify import Verification, verify_image
from sparkbuild.errors import AttestationError, PublishError, SignatureError
from sparkbuild.publish.destination import Destination
from sparkbuild.registry import manifests
from sparkbuild.registry.address import Manifest
from sparkbuild.registry.client import RegistryClient
from sparkbuild.spec import Build

if TYPE_CHECKING:
    from docker import DockerClient


@dataclass(frozen=True)
class Signing:
    """How publish signs: the signer, and its public key (None for keyless) to check what it
    attached."""

    signer: Signer
    public: PublicKey | None = field(default=None)


def _engine_listed(found: contents.ImageContents, build: Build) -> None:
    """The engine's own Python distribution is in the SBOM (for an engine that is one)."""
    probe = getattr(adapter_type(build.engine).preflight, "probe", None)
    names = {canonicalize_name(n) for n in getattr(probe, "distributions", ())}
    listed = {canonicalize_name(d.name) for d in found.distributions}
    if names and not names & listed:
        raise PublishError(
            f"{build.name}: the SBOM lists no {' or '.join(sorted(names))} distribution, the "
            f"engine the image is built for ({len(found.distributions)} Python distributions "
            "listed); nothing was signed",
            "check that the engine is pip-installed in the image (`docker run IMAGE python3 -m "
            "pip show ENGINE`); publish without --sign-key only to publish it unsigned",
        )


def _subject(
    client: RegistryClient, destination: Destination, manifest: Manifest, platform: str
) -> statements.Subject:
    digests = [manifest.digest]
    if manifests.is_index(manifest):
        digests += manifests.platform_manifests(manifest, platform)
    return statements.Subject(destination.reference, tuple(dict.fromkeys(digests)))


def _statements(
    build: Build,
    entry: lockfile.BuildEntry,
    subject: statements.Subject,
    made: sbom.Sbom,
    image_id: str,
    spec_file: str,
) -> dict[str, bytes]:
    provenance = statements.provenance(build.name, spec_file, entry)
    verdicts = statements.verdicts(build.name, entry, image_id, subject.digests[0])
    return {
        statements.SBOM_PREDICATE: statements.statement(
            subject, statements.SBOM_PREDICATE, made.document
        ),
        statements.PROVENANCE_PREDICATE: statements.statement(
            subject, statements.PROVENANCE_PREDICATE, provenance
        ),
        statements.VERDICTS_PREDICATE: statements.statement(
            subject, statements.VERDICTS_PREDICATE, verdicts
        ),
    }


def _check(verification: Verification) -> None:
    failed = [f for f in verification.findings if not f.ok]
    if not failed:
        return
    listed = "; ".join(f"{f.name}: {f.detail}" for f in failed)
    error = SignatureError if any(f.name == "signature" for f in failed) else AttestationError
    raise error(
        f"{verification.reference}: what was attached does not verify ({listed}); the aliases "
        "were not moved and nothing was recorded",
        "run the same command again; if it fails again, check what else writes to the repository",
    )


def already_signed(
    client: RegistryClient,
    destination: Destination,
    record: lockfile.SignedRecord | None,
    digest: str,
    signing: Signing,
) -> bool:
    """A re-run: the lock records this digest signed by this key, and it still verifies."""
    if record is None or signing.public is None or record.key != signing.public.fingerprint:
        return False
    verification = verify_image(client, destination.repository, digest, signing.public)
    return verification.ok


def read_during_push(image_id: str) -> Future[contents.ImageContents]:
    """The image's contents for the SBOM, read in a thread of its own while the push runs:
    both wait on the Docker daemon, and the read no longer adds its seconds after the push
    (benchmarks/bench_signing.py). It reads the local image, which the push does not
    change; a push that fails leaves it to finish and be dropped."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sbom-contents")
    try:
        return pool.submit(lambda: contents.read_contents(dockerhost.client(), image_id))
    finally:
        pool.shutdown(wait=False)


def sign_publication(  # noqa: PLR0913 - a publication's parts, as publish_build holds them
    api: DockerClient,
    client: RegistryClient,
    build: Build,
    entry: lockfile.BuildEntry,
    destination: Destination,
    manifest: Manifest,
    image: lockfile.ImageSection,
    signing: Signing,
    spec_file: str,
    read: Future[contents.ImageContents] | None = None,
) -> lockfile.SignedRecord:
    """Attach the SBOM, provenance and verdicts to ``manifest`` and sign it; the record.
    ``read``: the image's contents, already being read (:func:`read_during_push`)."""
    image_id = str(image.image_id)
    platform = str(image.platform or build.image.platform)
    subject = _subject(client, destination, manifest, platform)
    with console.status(f"{build.name}: reading the SBOM's contents from {image_id[:19]}"):
        found = read.result() if read is not None else contents.read_contents(api, image_id)
    _engine_listed(found, build)
    made = sbom.build_sbom(found, build.name, entry, destination.reference, manifest.digest)
    attached = sign_and_attach(
        client,
        destination.repository,
        manifest,
        _statements(build, entry, subject, made, image_id, spec_file),
        signing.signer,
        signing.public,
    )
    if signing.public is not None:
        _check(verify_image(client, destination.repository, manifest.digest, signing.public))
    kinds = {uri: kind for kind, uri in statements.KINDS.items()}
    return lockfile.SignedRecord(
        key=attached.identity,
        signature=attached.signature,
        attestations={kinds[uri]: digest for uri, digest in attached.attestations.items()},
        referrers="api" if attached.referrers_api else "tag",
        sbom_packages=made.packages,
    )
