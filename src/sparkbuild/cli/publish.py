"""``sparkbuild publish`` and ``sparkbuild rollback``: the publication stage."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from sparkbuild import console, lockfile
from sparkbuild.cli import emit_json, options, run_per_build
from sparkbuild.publish import (
    DEFAULT_ALIASES,
    DEFAULT_REPOSITORY,
    Destination,
    PublishResult,
    RollbackResult,
    Signing,
    choose_repository,
    layers,
    plan_destination,
    publish_build,
    render_repository,
    rollback_build,
)
from sparkbuild.redact import Redactor
from sparkbuild.registry import credentials as creds
from sparkbuild.registry.address import Registry
from sparkbuild.settings import Settings
from sparkbuild.spec import Build, load_builds, select


def _credential_options(func: Any) -> Any:
    func = click.option(
        "--password-stdin",
        is_flag=True,
        help=f"Read the registry password/token from stdin (user: --username or {creds.USER_ENV}).",
    )(func)
    return click.option(
        "--username",
        metavar="USER",
        help=f"Registry user [env {creds.USER_ENV}; else docker's credential store].",
    )(func)


def _credentials(host: str, username: str | None, password_stdin: bool) -> creds.Credentials:
    secret = sys.stdin.read() if password_stdin else None
    # Redact the environment's password even if the docker store's credentials are used.
    with Redactor([secret, os.environ.get(creds.PASSWORD_ENV)]).guard("reading credentials"):
        return creds.resolve(host, username=username, password_stdin=secret)


def _redactor(found: creds.Credentials) -> Redactor:
    redactor = found.redactor()
    redactor.add(os.environ.get(creds.PASSWORD_ENV))
    return redactor


def _signing(sign_key: Path | None, keyless: bool) -> Signing | None:
    """How publish signs: a key pair (--sign-key or the environment), keyless, or not at all.
    The key is read (and its passphrase checked) before anything is pushed."""
    from sparkbuild.attest import keys
    from sparkbuild.attest.signing import KeylessSigner, KeySigner

    if keyless and keys.configured_private(sign_key):
        raise click.UsageError("--keyless and a signing key both given; pass one")
    if keyless:
        return Signing(KeylessSigner())
    if not keys.configured_private(sign_key):
        return None
    key = keys.load_private(sign_key, keys.passphrase_from_env(prompt=True))
    return Signing(KeySigner(key), key.public)


def _publish_line(result: PublishResult) -> str:
    what = "pushed" if result.pushed else "already published"
    moved = [
        f"{alias} ({'unchanged' if old == result.digest else 'moved from ' + (old or 'nothing')})"
        for alias, old in result.aliases.items()
    ]
    verified = "" if result.verified else " [UNVERIFIED: --force]"
    line = f"{result.build}: {what} {result.repository}:{result.tag}@{result.digest}{verified}"
    line += f"\n  aliases: {', '.join(moved)}" if moved else ""
    signed = result.signed
    if signed is not None:
        kinds = ", ".join(signed.attestations)
        line += (
            f"\n  signed by {str(signed.key)[:19]}; attested: {kinds} "
            f"(SBOM: {signed.sbom_packages} packages; referrers: {signed.referrers})"
        )
    return line


@click.command(name="publish")
@click.argument("builds", nargs=-1, required=True)
@click.option(
    "--registry",
    "registry_text",
    required=True,
    metavar="REG",
    help="Registry and namespace, e.g. ghcr.io/my-org or 127.0.0.1:5000.",
)
@click.option(
    "--repository",
    default=DEFAULT_REPOSITORY,
    show_default=True,
    help="Repository under REG; placeholders {engine}, {version}, {build}.",
)
@click.option(
    "--alias",
    "aliases",
    multiple=True,
    metavar="TAG",
    help="A moving tag, repeatable, e.g. latest [default: {version}-sm121]. "
    "The immutable tag {version}-sm121-{tree_short} is always pushed.",
)
@click.option("--no-alias", is_flag=True, help="Push only the immutable tag.")
@click.option(
    "--force",
    is_flag=True,
    help="Publish without a passing smoke verdict (recorded as unverified in images.lock).",
)
@click.option(
    "--max-layer-size",
    metavar="SIZE",
    help="Refuse, before pushing, any layer larger than SIZE (e.g. 10GB) "
    f"[env {layers.LIMIT_ENV}; default: the registry's own limit, 10GB for ghcr.io].",
)
@options.sign_key()
@click.option(
    "--keyless",
    is_flag=True,
    help="Sign with Sigstore's keyless flow (GitHub Actions OIDC; the `keyless` extra).",
)
@_credential_options
@options.json()
@click.pass_obj
def publish_command(  # noqa: PLR0913 - click passes each option as a parameter
    settings: Settings,
    builds: tuple[str, ...],
    registry_text: str,
    repository: str,
    aliases: tuple[str, ...],
    no_alias: bool,
    force: bool,
    max_layer_size: str | None,
    sign_key: Path | None,
    keyless: bool,
    username: str | None,
    password_stdin: bool,
    as_json: bool,
) -> None:
    """Push the smoke-tested images of BUILDS to REG by digest and record them in images.lock.

    An image is pushed only if images.lock records a passing smoke verdict for its image id
    under every profile the build lists. With a signing key (or --keyless) it is then signed,
    with its SBOM, provenance and verdicts attached (docs/verify.md). Running it again is a
    no-op.
    """
    signing = _signing(sign_key, keyless)
    registry = Registry.parse(registry_text)
    layer_limit = layers.limit_for(registry.host, max_layer_size)
    selected = select(load_builds(settings), builds)
    alias_templates = () if no_alias else (aliases or DEFAULT_ALIASES)

    def destination_of(build: Build, tree: str) -> Destination:
        return plan_destination(
            build, tree, registry, repository=repository, aliases=alias_templates
        )

    found = _credentials(registry.host, username, password_stdin)
    redactor = _redactor(found)
    lock = lockfile.LockHandle.open(settings.lock_file)  # read once; each build writes once

    def publish_one(build: Build) -> PublishResult:
        with redactor.guard(f"publishing {build.name}"):
            return publish_build(
                build,
                settings,
                destination_of,
                found,
                force=force,
                max_layer_size=layer_limit,
                lock=lock,
                signing=signing,
            )

    run_per_build(
        selected,
        publish_one,
        summary=_publish_line,
        json_path=options.json_destination(as_json),
        noun="publications",
    )


def _rollback_line(result: RollbackResult) -> str:
    aliases = ", ".join(result.aliases)
    if result.from_digest == result.to_digest:
        return (
            f"{result.build}: {result.repository} aliases {aliases} already at {result.to_digest}"
        )
    return (
        f"{result.build}: moved {result.repository} aliases {aliases}\n"
        f"  from {result.from_digest}\n  to   {result.to_digest}"
    )


@click.command(name="rollback")
@click.argument("build_name", metavar="BUILD")
@click.option(
    "--to", "to_digest", metavar="DIGEST", help="Roll back to this published digest instead."
)
@click.option(
    "--registry",
    "registry_text",
    metavar="REG",
    help="Which publication (needed when the build was published to several).",
)
@click.option(
    "--repository",
    default=None,
    help=f"Repository under REG, as given to publish [default: {DEFAULT_REPOSITORY}].",
)
@click.option("--force", is_flag=True, help="Allow a --to digest that never passed smoke.")
@options.public_key()
@_credential_options
@options.json()
@click.pass_obj
def rollback_command(  # noqa: PLR0913 - click passes each option as a parameter
    settings: Settings,
    build_name: str,
    to_digest: str | None,
    registry_text: str | None,
    repository: str | None,
    force: bool,
    key_path: Path | None,
    username: str | None,
    password_stdin: bool,
    as_json: bool,
) -> None:
    """Move BUILD's aliases back to the previous published digest that passed smoke.

    The history is images.lock's `publish` section; immutable tags are never touched. With a
    public key (--key, SPARKBUILD_PUBLIC_KEY or the project's cosign.pub) the aliases move
    only to a digest it signed.
    """
    from sparkbuild.attest import keys

    public = keys.configured_public(key_path, settings.project_dir)
    (build,) = select(load_builds(settings), [build_name])
    registry = Registry.parse(registry_text) if registry_text else None
    if repository is not None and registry is None:
        raise click.UsageError("--repository needs --registry")
    if repository is not None:
        repository = render_repository(repository, build)
    lock = lockfile.LockHandle.open(settings.lock_file)
    key = choose_repository(lock.entry(build.name), build, registry, repository)
    found = _credentials(key.split("/", 1)[0], username, password_stdin)
    with _redactor(found).guard(f"rolling back {build.name}"):
        result = rollback_build(
            build,
            settings,
            key,
            found,
            to_digest=to_digest,
            force=force,
            lock=lock,
            public=public,
        )
    if as_json:
        emit_json(result.to_json())
    else:
        console.out.print(_rollback_line(result), markup=False)


COMMANDS: list[click.Command] = [publish_command, rollback_command]
