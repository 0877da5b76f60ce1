"""``sparkbuild verify`` (a published image's signature and attestations) and ``sparkbuild
keys`` (making a key pair, rendering the Kubernetes policy)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from sparkbuild import console, fileio, imageref, lockfile
from sparkbuild.attest import keys, policy
from sparkbuild.attest.verify import Verification, check_project, verify_image
from sparkbuild.cli import emit_json, options
from sparkbuild.cli.rebuild import run_rebuild
from sparkbuild.engines.host_record import host_lines, verdict_hosts
from sparkbuild.errors import SigningKeyError, UsageError, VerificationFailedError
from sparkbuild.registry import credentials as creds
from sparkbuild.registry.address import DIGEST, Registry
from sparkbuild.registry.client import RegistryClient
from sparkbuild.settings import Settings
from sparkbuild.spec import load_builds


def public_key(settings: Settings, path: Path | None) -> keys.PublicKey:
    found = keys.configured_public(path, settings.project_dir)
    if found is None:
        raise UsageError(
            f"no public key to verify with: pass --key FILE, set {keys.PUBLIC_KEY_ENV}, or put "
            f"the project's key at {settings.project_dir / keys.PUBLIC_KEY_FILE}",
            "`sparkbuild keys generate` makes a key pair",
        )
    return found


def _split(reference: str) -> tuple[str, str, str]:
    """(host, repository, digest) of ``HOST/REPOSITORY@sha256:…``."""
    digest = imageref.digest_of(reference)
    if not digest or not DIGEST.match(digest):
        raise UsageError(
            f"{reference!r} names no digest; verify checks one exact image",
            "pass REF@sha256:… (`sparkbuild publish --json` prints it as `reference`)",
        )
    host, repository = imageref.split_reference(reference)
    return host, repository, digest


def _line(verification: Verification) -> str:
    width = max(len(f.name) for f in verification.findings)
    lines = [
        f"  {'ok  ' if f.ok else 'FAIL'}  {f.name.ljust(width)}  {f.detail}"
        for f in verification.findings
    ]
    verdict = "verified" if verification.ok else "NOT VERIFIED"
    return "\n".join([f"{verification.reference}: {verdict} (key {verification.key[:19]})", *lines])


@click.command(name="verify")
@click.argument("reference", metavar="REF@DIGEST")
@options.public_key()
@click.option(
    "--rebuild",
    is_flag=True,
    help="Rebuild the image from its signed provenance alone (no images.lock) and compare "
    "digests; name every difference (docs/verify.md, 'Rebuilding a published image').",
)
@options.json()
@click.pass_obj
def verify_command(
    settings: Settings, reference: str, key_path: Path | None, rebuild: bool, as_json: bool
) -> None:
    """Check a published image: its signature, each attestation's signature and subject, the
    provenance against images.lock, and a passing smoke verdict for each profile.

    Every finding is named; the exit status is 1 when any failed.
    """
    host, repository, digest = _split(reference)
    public = public_key(settings, key_path)
    client = RegistryClient(Registry.parse(host), creds.resolve(host))
    if rebuild:
        run_rebuild(settings, client, repository, digest, public, as_json)
        return
    profiles = {name: build.smoke_profiles for name, build in load_builds(settings).items()}
    lock = lockfile.load(settings.lock_file)  # a lock it cannot read fails before the registry
    result = verify_image(client, repository, digest, public)
    check_project(result, profiles, lock)
    hosts, elsewhere = verdict_hosts(result.predicates.get("verdicts"))
    if as_json:
        emit_json({**result.to_json(), "hosts": hosts, "elsewhere": elsewhere})
    else:
        console.out.print(_line(result), markup=False)
        for line in [*host_lines(hosts), *elsewhere]:
            console.out.print(f"  {line}", markup=False)
    if not result.ok:
        failed = ", ".join(f.name for f in result.findings if not f.ok)
        raise VerificationFailedError(
            f"{result.reference}: {failed} failed",
            "the image is not what this project published and tested; do not run it",
        )


@click.group(name="keys")
def keys_group() -> None:
    """Signing keys: make a key pair, render the Kubernetes policy that checks it."""


@keys_group.command(name="generate")
@click.option(
    "--output-prefix",
    "prefix",
    default="cosign",
    show_default=True,
    help="Write PREFIX.key (private, mode 0600) and PREFIX.pub.",
)
@options.json()
def generate_command(prefix: str, as_json: bool) -> None:
    """Make an ECDSA P-256 key pair in cosign's format, the private key encrypted with the
    passphrase in SPARKBUILD_SIGNING_PASSWORD (or typed twice on a terminal)."""
    private, public = keys.key_paths(prefix)  # before the passphrase is asked for
    passphrase = _new_passphrase()
    private_pem, public_pem = keys.generate(passphrase)
    keys.write_pair(private, private_pem, public, public_pem)
    fingerprint = keys.PublicKey(keys.public_from_pem(public_pem, str(public)), "").fingerprint
    if as_json:
        emit_json({"private": str(private), "public": str(public), "fingerprint": fingerprint})
        return
    console.out.print(
        f"wrote {private} (private, mode 0600: keep it secret) and {public}\n"
        f"  fingerprint {fingerprint}\n"
        f"  commit {public.name} to the project as cosign.pub; give publish the private key "
        f"with --sign-key or {keys.KEY_ENV}",
        markup=False,
    )


def _new_passphrase() -> bytes:
    if os.environ.get(keys.PASSWORD_ENV) or not console.interactive():
        passphrase = keys.passphrase_from_env()
    else:
        typed = click.prompt(
            "passphrase for the new key", hide_input=True, confirmation_prompt=True
        )
        passphrase = str(typed).encode()
    if not passphrase:
        raise SigningKeyError(
            f"a new key needs a passphrase: {keys.PASSWORD_ENV} is empty",
            "the private key is encrypted with it, as cosign's are",
        )
    return passphrase


@keys_group.command(name="policy")
@click.option(
    "--image",
    "images",
    multiple=True,
    required=True,
    metavar="PATTERN",
    help="Images the policy covers, e.g. 'ghcr.io/my-org/sparkbuild/*' (repeatable).",
)
@click.option("--name", default="sparkbuild-signed-images", show_default=True)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write the policy to FILE instead of stdout.",
)
@options.public_key()
@click.pass_obj
def policy_command(
    settings: Settings,
    images: tuple[str, ...],
    name: str,
    output: Path | None,
    key_path: Path | None,
) -> None:
    """Print a Kyverno ClusterPolicy that admits the images only when signed by the key, with
    signed provenance and passing verdicts (docs/verify.md)."""
    patterns = policy.check_patterns(images)
    public = public_key(settings, key_path)
    if settings.lock_file.is_file():  # a policy for images never published guards nothing
        for warning in policy.unpublished(patterns, lockfile.load(settings.lock_file)):
            console.warn(warning)
    text = policy.render(policy.kyverno_policy(public, patterns, policy.check_name(name)))
    if output is None:
        click.echo(text, nl=False)
    else:
        fileio.write_output(output, text, "--output")


COMMANDS: list[click.Command] = [verify_command, keys_group]
